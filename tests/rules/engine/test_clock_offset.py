"""Engines whose wall clock is wrong (issue 23, item 8): the lease is judged on the NATS server's time, and an
engine too far off it does not lead, so it neither takes over a healthy leader nor fires anything early."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

from gpuevents.bus import Bus
from gpuevents.clock import SystemClock
from gpuevents.config import Config
from rules.engine.partitions.lease import LEASE_KEY, LeaseRecord
from rules.engine.service import Engine
from tests.waiting import wait_for


class ShiftedClock:
    """A wall clock `shift` seconds off the true time (a standby whose NTP is broken)."""

    def __init__(self, shift: float) -> None:
        self.shift = shift
        self._true = SystemClock()

    def now(self) -> datetime:
        return self._true.now() + timedelta(seconds=self.shift)

    def monotonic(self) -> float:
        return self._true.monotonic()


def fast_lease(config: Config) -> Config:
    return config.model_copy(update={"engine": config.engine.model_copy(update={"lease_ttl": 1.5})})


@contextlib.asynccontextmanager
async def started(engine: Engine) -> AsyncIterator[asyncio.Task[None]]:
    stop = asyncio.Event()
    task = asyncio.create_task(engine.run(stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def ticks_of(engine: Engine, n: int) -> None:
    """Wait until `engine`'s lease has ticked `n` times (each tick judges the lease, and refuses when off)."""
    await wait_for(lambda: engine.lease.ticks >= n, 20, interval=0.05,
                   what=f"{n} lease ticks of {engine.lease.holder}")


async def lease_holder(bus: Bus) -> str:
    entry = await (await bus.kv()).get(LEASE_KEY)
    assert entry is not None
    return LeaseRecord.model_validate_json(entry.value).holder


async def test_a_standby_an_hour_ahead_neither_takes_the_lease_nor_leads_alone(engine_config: Config, bus: Bus) -> None:
    """Before: the standby's clock said the leader's lease had lapsed; it took it over at once."""
    config = fast_lease(engine_config)
    a = await Engine.open(config, bus, holder="a")
    b = await Engine.open(config, bus, holder="b", clock=ShiftedClock(3600))
    async with started(a) as ta:
        await wait_for(lambda: a.leader.is_set() or ta.done(), what="a to lead")
        async with started(b) as tb:
            await ticks_of(b, 4)
            assert a.leader.is_set() and not b.ready.is_set() and not tb.done()
            assert await lease_holder(bus) == "a"
            offset = b.metrics.registry.get_sample_value("gpuevents_engine_clock_offset_seconds")
            assert offset is not None and 3590 < offset < 3610
        b2 = await Engine.open(config, bus, holder="b2", clock=ShiftedClock(3600))
    # the healthy leader has gone and released its lease: the skewed engine still does not lead
    async with started(b2):
        await ticks_of(b2, 4)
        assert not b2.ready.is_set()
        assert not b2.core.open_incidents()


async def test_a_standby_20s_ahead_judges_the_lease_on_server_time(engine_config: Config, bus: Bus) -> None:
    """Within engine.max_clock_offset a skewed engine may lead, but the leader's expiry is the server's: a clock
    20 s fast does not see a lease of 10 s as lapsed (before: it took it over at once)."""
    a = await Engine.open(engine_config, bus, holder="a")
    b = await Engine.open(engine_config, bus, holder="b", clock=ShiftedClock(20))
    async with started(a) as ta:
        await wait_for(lambda: a.leader.is_set() or ta.done(), what="a to lead")
        async with started(b):
            await ticks_of(b, 3)
            assert a.leader.is_set() and not b.leader.is_set()
            assert await lease_holder(bus) == "a"
            assert 15 < b.lease.offset < 25 and not b.lease.refusing
