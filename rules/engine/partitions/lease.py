"""Leadership between engine replicas: one KV lease, renewed with compare-and-set, taken over when it lapses."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from datetime import datetime, timedelta

import orjson
from pydantic import BaseModel

from gpuevents.bus import BusError, Kv, KvExists, KvWrongRevision
from gpuevents.clock import Clock
from gpuevents.kvstate import parse_or_none

log = logging.getLogger(__name__)

LEASE_KEY = "lease.engine"
CLOCK_KEY = "lease.clock"  # a standby's probe: when the server stored it tells this clock's offset
MEASURE_EVERY_S = 10.0  # how often the offset is measured again (a holder measures on its own renewal)
RELEASE_WAIT_S = 2.0  # how long a release may take before the lease is left to lapse
OFFSET_LOG_S = 60.0  # while refusing to lead for a wrong clock, one error line this often


def lease_key(partition: int | None) -> str:
    """The lease of the whole fleet's engine, or of one partition's."""
    return LEASE_KEY if partition is None else f"{LEASE_KEY}.p{partition}"


class LeaseRecord(BaseModel):
    holder: str
    expires_at: datetime
    acquired_at: datetime


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Lease:
    """Call `tick()` every `ttl / 3`: it renews the lease we hold or takes one that has lapsed.

    Two replicas never both hold it: every write is a compare-and-set on the key's revision, and a
    holder that cannot renew before `expires_at` stops acting (`held` turns false) before anyone
    else may take over, because takeover waits for the same expiry.

    With `max_offset` (a wall clock; not a test's or a backtest's virtual one), times are the NATS server's:
    each tick measures this clock's offset from it (when the server stored a write), records and judges
    expiry in server time, and refuses to lead while the offset is beyond `max_offset` (DESIGN §7.1), so
    a standby with a wrong clock never takes over a healthy leader nor acts early.
    """

    def __init__(self, kv: Kv, clock: Clock, ttl: float, holder: str | None = None,
                 key: str = LEASE_KEY, max_offset: float | None = None) -> None:
        self.kv = kv
        self.clock = clock
        self.ttl = ttl
        self.holder = holder or default_holder()
        self.key = key
        self.max_offset = max_offset
        self.offset = 0.0  # this clock minus the server's, in seconds (0 until measured)
        self.refusing = False  # the offset is beyond max_offset: this replica does not lead
        self.ticks = 0
        self._offset_logged = float("-inf")
        self._next_measure = float("-inf")
        self._revision: int | None = None
        self._expires_at: datetime | None = None
        self._acquired_at: datetime | None = None

    def _now(self) -> datetime:
        """The server's time, as far as this clock and its measured offset tell."""
        return self.clock.now() - timedelta(seconds=self.offset)

    @property
    def held(self) -> bool:
        return self._expires_at is not None and not self.refusing and self._now() < self._expires_at

    def _due(self) -> bool:
        return self.max_offset is not None and self.clock.monotonic() >= self._next_measure

    async def _offset_of(self, before: datetime, revision: int) -> None:
        """This clock's offset from the server's: a write's local midpoint against when the server stored it."""
        after = self.clock.now()
        try:
            stored = await self.kv.stored_at(revision)
        except BusError as e:  # measured again at the next tick; the write itself went through
            log.debug("could not read when the server stored a lease write: %s", e)
            return
        if stored is not None:  # None: written over meanwhile (another replica's probe); measured next time
            self.offset = ((before + (after - before) / 2) - stored).total_seconds()
            self._next_measure = self.clock.monotonic() + MEASURE_EVERY_S

    async def tick(self, may_acquire: bool = True) -> bool:
        """Renew or acquire; True when we hold the lease afterwards. With `may_acquire` false, a lease we do not
        hold is left to others even when it has lapsed (a replica already holding its fair share)."""
        self.ticks += 1
        if self.max_offset is not None:
            if self._due() and not self.held:  # a holder measures on its renewal (below)
                before = self.clock.now()
                await self._offset_of(before, await self.kv.put(CLOCK_KEY, self.holder.encode()))
            if abs(self.offset) > self.max_offset:
                return await self._refuse()
            self.refusing = False
        measure, before = self._due(), self.clock.now()
        now = self._now()
        record = LeaseRecord(holder=self.holder, expires_at=now + timedelta(seconds=self.ttl),
                             acquired_at=now)
        try:
            if self._revision is not None and self.held:
                record = record.model_copy(update={"acquired_at": self._acquired_at})
                self._revision = await self.kv.update(self.key, self._dump(record), last=self._revision)
            elif not may_acquire:
                self._lose()
                return False
            else:
                current = await self.kv.get(self.key)
                if current is None:
                    self._revision = await self.kv.create(self.key, self._dump(record))
                else:
                    other = parse_or_none(LeaseRecord, current, "taking the lease over it")
                    if other is not None and other.holder != self.holder and other.expires_at > now:
                        self._lose()
                        return False
                    self._revision = await self.kv.update(self.key, self._dump(record),
                                                          last=current.revision)
                    log.info("engine lease acquired by %s", self.holder)
        except (KvExists, KvWrongRevision):
            if self._expires_at is not None:
                log.warning("engine lease lost by %s", self.holder)
            self._lose()
            return False
        self._expires_at = record.expires_at
        self._acquired_at = record.acquired_at
        if measure and self._revision is not None:
            await self._offset_of(before, self._revision)
        return True

    async def _refuse(self) -> bool:
        """The clock is too far from the server's to lead: give up what we hold, say so (loudly, repeatedly)."""
        if self.clock.monotonic() - self._offset_logged >= OFFSET_LOG_S:
            self._offset_logged = self.clock.monotonic()
            log.error("this engine's clock is %+.1fs off the NATS server's (engine.max_clock_offset %gs): it does "
                      "not lead until its clock is right (check NTP/chrony)", self.offset, self.max_offset)
        if self._revision is not None and self._expires_at is not None:
            await self.release()
        self.refusing = True
        self._lose()
        return False

    async def release(self) -> None:
        """Give the lease up at shutdown so a standby takes over at once."""
        if self._revision is not None and self._expires_at is not None and self._now() < self._expires_at:
            try:
                past = self._now() - timedelta(seconds=1)
                rec = LeaseRecord(holder=self.holder, expires_at=past, acquired_at=past)
                # bounded: a stopping engine must not wait out NATS (the lease lapses by itself anyway)
                await asyncio.wait_for(self.kv.update(self.key, self._dump(rec), last=self._revision),
                                       RELEASE_WAIT_S)
            except KvWrongRevision:
                pass
            except (BusError, TimeoutError) as e:  # NATS away: the lease lapses, a standby then takes over
                log.warning("could not release the engine lease (%s); it lapses within %gs",
                            str(e) or f"no answer within {RELEASE_WAIT_S:g}s", self.ttl)
        self._lose()

    def _lose(self) -> None:
        self._revision = None
        self._expires_at = None

    @staticmethod
    def _dump(record: LeaseRecord) -> bytes:
        return orjson.dumps(record.model_dump(mode="json"))
