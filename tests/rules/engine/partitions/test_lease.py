"""The engine lease in a real KV bucket: one holder at a time, renewed, taken over once lapsed, released."""

from __future__ import annotations

from datetime import timedelta

from gpuevents.bus import Bus
from gpuevents.clock import ManualClock
from rules.engine.partitions.lease import LEASE_KEY, Lease, LeaseRecord
from tests.rules.engine.conftest import T0


async def test_one_holder_at_a_time_and_a_renewal_keeps_when_it_was_acquired(bus: Bus) -> None:
    kv = await bus.kv()
    clock = ManualClock(T0)
    a, b = Lease(kv, clock, 10, holder="a"), Lease(kv, clock, 10, holder="b")
    assert await a.tick() is True
    assert await b.tick() is False and not b.held
    clock.advance(3)
    assert await a.tick() is True and a.held
    entry = await kv.get(LEASE_KEY)
    assert entry is not None
    record = LeaseRecord.model_validate_json(entry.value)
    assert (record.holder, record.acquired_at) == ("a", T0)
    assert record.expires_at == clock.now() + timedelta(seconds=10)


async def test_a_lapsed_lease_is_taken_over_and_its_old_holder_stops_holding_it(bus: Bus) -> None:
    kv = await bus.kv()
    clock = ManualClock(T0)
    a, b = Lease(kv, clock, 10, holder="a"), Lease(kv, clock, 10, holder="b")
    assert await a.tick()
    clock.advance(11)  # a could not renew in time
    assert not a.held
    assert await b.tick() is True
    assert await a.tick() is False and not a.held


async def test_a_released_lease_is_taken_at_once(bus: Bus) -> None:
    kv = await bus.kv()
    clock = ManualClock(T0)
    a, b = Lease(kv, clock, 10, holder="a"), Lease(kv, clock, 10, holder="b")
    assert await a.tick()
    await a.release()
    assert not a.held
    assert await b.tick() is True
