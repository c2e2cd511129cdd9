"""Leadership between engine replicas: one KV lease, renewed with compare-and-set, taken over when it lapses."""

from __future__ import annotations

import logging
import os
import socket
from datetime import datetime, timedelta

import orjson
from pydantic import BaseModel

from gpuevents.bus import Kv, KvExists, KvWrongRevision
from gpuevents.clock import Clock
from gpuevents.kvstate import parse_or_none

log = logging.getLogger(__name__)

LEASE_KEY = "lease.engine"


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
    """

    def __init__(self, kv: Kv, clock: Clock, ttl: float, holder: str | None = None,
                 key: str = LEASE_KEY) -> None:
        self.kv = kv
        self.clock = clock
        self.ttl = ttl
        self.holder = holder or default_holder()
        self.key = key
        self._revision: int | None = None
        self._expires_at: datetime | None = None
        self._acquired_at: datetime | None = None

    @property
    def held(self) -> bool:
        return self._expires_at is not None and self.clock.now() < self._expires_at

    async def tick(self, may_acquire: bool = True) -> bool:
        """Renew or acquire; True when we hold the lease afterwards. With `may_acquire` false, a lease we do not
        hold is left to others even when it has lapsed (a replica already holding its fair share)."""
        now = self.clock.now()
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
        return True

    async def release(self) -> None:
        """Give the lease up at shutdown so a standby takes over at once."""
        if self._revision is not None and self.held:
            try:
                past = self.clock.now() - timedelta(seconds=1)
                rec = LeaseRecord(holder=self.holder, expires_at=past, acquired_at=past)
                await self.kv.update(self.key, self._dump(rec), last=self._revision)
            except KvWrongRevision:
                pass
        self._lose()

    def _lose(self) -> None:
        self._revision = None
        self._expires_at = None

    @staticmethod
    def _dump(record: LeaseRecord) -> bytes:
        return orjson.dumps(record.model_dump(mode="json"))
