"""One replica of a partitioned engine (`engine.partitions` > 1): an Engine for every partition, each taking its
partition's lease only while this replica holds less than its fair share of the partitions.

Replicas announce themselves in KV (`replica.<holder>`, renewed every third of the lease TTL); a replica's fair
share is the partitions divided by the replicas alive, rounded up. A replica that dies stops renewing its leases
and its announcement, so within about one TTL the others' shares grow and they take its partitions (their
incidents, limit windows and snoozes come from KV with them). A replica holding more than its share (a new one
joined) gives one partition back at a time.
"""

from __future__ import annotations

import asyncio
import logging
import math
from datetime import datetime, timedelta
from typing import Self

import orjson

from gpuevents.aio import guarded_task, sleep_or_stop, stop_tasks, until_stop_or_end
from gpuevents.bus import Bus, BusError, Kv
from gpuevents.clock import Clock, SystemClock
from gpuevents.config import Config
from gpuevents.subjects import kv_token
from rules.engine.gcpolicy import GcPolicy
from rules.engine.metrics import EngineMetrics
from rules.engine.partitions.lease import default_holder
from rules.engine.service import Engine
from rules.usage.recorder import UsageRecorder

log = logging.getLogger(__name__)

REPLICA_PREFIX = "replica."


def replica_key(holder: str) -> str:
    """A replica's announcement: its holder name as one KV token (the default, `host:pid`, has a `:`)."""
    return REPLICA_PREFIX + kv_token(holder)


class EngineReplica:
    """`run(stop)` runs this replica's share of the partitions until `stop` is set."""

    def __init__(self, config: Config, bus: Bus, clock: Clock, holder: str, metrics: EngineMetrics, gc: GcPolicy,
                 usage: UsageRecorder, engines: list[Engine]) -> None:
        self.config = config
        self.bus = bus
        self.clock = clock
        self.holder = holder
        self.partitions = config.engine.partitions
        self.metrics = metrics
        self.gc = gc
        self.usage = usage  # the replica's partitions count usage together
        self.engines = engines
        self.replicas = 1  # alive, this one included, as last read from KV

    @classmethod
    async def open(cls, config: Config, bus: Bus, *, clock: Clock | None = None, holder: str | None = None,
                   metrics: EngineMetrics | None = None) -> Self:
        """A replica with an engine open for every partition, sharing its collector policy and usage recorder."""
        clock = clock or SystemClock()
        holder = holder or default_holder()
        metrics = metrics or EngineMetrics()
        gc, usage = GcPolicy(), UsageRecorder.from_config(config)
        engines: list[Engine] = []
        replica = cls(config, bus, clock, holder, metrics, gc, usage, engines)
        for p in range(config.engine.partitions):  # each asks the replica before taking a lapsed lease
            engines.append(await Engine.open(config, bus, clock=clock, holder=holder, partition=p, metrics=metrics,
                                             may_acquire=replica.may_acquire, gc=gc, usage=usage))
        return replica

    @property
    def held(self) -> list[int]:
        """The partitions this replica acts for now."""
        return [e.partition for e in self.engines if e.leader.is_set() and e.partition is not None]

    def fair_share(self) -> int:
        return math.ceil(self.partitions / max(1, self.replicas))

    def may_acquire(self) -> bool:
        return len(self.held) < self.fair_share()

    async def run(self, stop: asyncio.Event) -> None:
        kv = await self.bus.kv()
        self.gc.start()
        ttl = float(self.config.engine.lease_ttl)
        stops = [asyncio.Event() for _ in self.engines]
        runs = [guarded_task(e.run(s), f"engine partition {e.partition}") for e, s in zip(self.engines, stops,
                                                                                         strict=True)]
        membership = guarded_task(self._membership(kv, ttl, stop), "engine replica membership")
        try:
            await until_stop_or_end([*runs, membership], stop, "the engine replica")
        finally:
            for s in stops:
                s.set()
            await asyncio.wait(runs, timeout=30)
            await stop_tasks([*runs, membership], "engine replica")
            await self._leave(kv)
            try:
                await self.usage.flush(self.clock.now())
            except Exception:
                log.exception("the last usage rollups could not be written")
            self.usage.close()
            self.gc.stop()

    async def _membership(self, kv: Kv, ttl: float, stop: asyncio.Event) -> None:
        """Announce this replica, count the live ones, and give back a partition over the fair share."""
        over = 0
        while not stop.is_set():
            now = self.clock.now()
            try:
                await kv.put(replica_key(self.holder),
                             orjson.dumps({"expires_at": (now + timedelta(seconds=ttl)).isoformat()}))
                self.replicas = await self._count_live(kv, now)
            except BusError as e:
                log.warning("replica %s: cannot reach KV to count the replicas: %s", self.holder, e)
            held = self.held
            over = over + 1 if len(held) > self.fair_share() else 0
            if over >= 2:  # over the share twice in a row: not a moment's race between two takeovers
                engine = self.engines[max(held)]
                log.info("replica %s holds %d of %d partitions with %d replicas alive: giving partition %s back",
                         self.holder, len(held), self.partitions, self.replicas, engine.partition)
                await engine.give_back()
                over = 0
            self.metrics.leader.set(len(self.held))
            await sleep_or_stop(stop, max(0.05, ttl / 3))

    async def _count_live(self, kv: Kv, now: datetime) -> int:
        live = 0
        for entry in await kv.items(REPLICA_PREFIX):
            try:
                expires = datetime.fromisoformat(orjson.loads(entry.value)["expires_at"])
            except (ValueError, KeyError, TypeError):
                continue
            if expires > now:
                live += 1
        return max(1, live)

    async def _leave(self, kv: Kv) -> None:
        try:
            await kv.delete(replica_key(self.holder))
        except BusError as e:
            log.warning("replica %s: could not withdraw its announcement: %s", self.holder, e)
