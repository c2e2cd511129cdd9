"""Unreadable values in the KV bucket (issue 23, item 7): read as absent, counted, repaired; no engine exits."""

from __future__ import annotations

import asyncio

from gpuevents.bus import Bus
from gpuevents.config import Config
from gpuevents.kvstate import UNREADABLE
from rules.engine.partitions.lease import LEASE_KEY, LeaseRecord
from rules.engine.service import Engine
from rules.engine.store import incident_key, snooze_key
from tests.rules.engine.helpers import running
from tests.waiting import wait_for

GARBAGE = b"\x00not json{"


def unreadable(engine: Engine, kind: str) -> float:
    return engine.metrics.registry.get_sample_value("gpuevents_kv_unreadable_total", {"kind": kind}) or 0.0


async def test_a_running_engine_keeps_the_lease_over_an_unreadable_lease_record(
    engine_config: Config, bus: Bus
) -> None:
    """Before: LeaseRecord's ValidationError ended the running engine."""
    kv = await bus.kv()
    engine = await Engine.open(engine_config.model_copy(update={"engine": engine_config.engine.model_copy(
        update={"lease_ttl": 1.5})}), bus, holder="e1")
    stop = asyncio.Event()
    task = asyncio.create_task(engine.run(stop))
    try:
        await wait_for(lambda: engine.ready.is_set() or task.done(), what="the lease")
        before = unreadable(engine, "lease")
        await kv.put(LEASE_KEY, GARBAGE)

        async def repaired() -> bool:
            entry = await kv.get(LEASE_KEY)
            return entry is not None and entry.value != GARBAGE and engine.leader.is_set()

        await wait_for(repaired, 10, what="the engine to take its lease back over the garbage")
        assert not task.done()
        entry = await kv.get(LEASE_KEY)
        assert entry is not None and LeaseRecord.model_validate_json(entry.value).holder == "e1"
        assert unreadable(engine, "lease") > before
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_a_fresh_engine_starts_over_unreadable_lease_incident_and_snooze_values(
    engine_config: Config, bus: Bus
) -> None:
    """Before: every fresh engine exited at start until someone purged the key by hand."""
    kv = await bus.kv()
    await kv.put(LEASE_KEY, GARBAGE)
    bad_incident, bad_snooze = incident_key("idle-gpu-1h", "n1/gpu0"), snooze_key("idle-gpu-1h", "n1/gpu0")
    await kv.put(bad_incident, b'{"rule": 7}')
    await kv.put(bad_snooze, b"[]")
    before = UNREADABLE.counts.copy()
    async with running(await Engine.open(engine_config, bus, holder="fresh")) as engine:
        assert engine.leader.is_set()
        entry = await kv.get(LEASE_KEY)
        assert entry is not None and LeaseRecord.model_validate_json(entry.value).holder == "fresh"
        assert await kv.get(bad_incident) is None and await kv.get(bad_snooze) is None  # repaired
    for kind in ("lease", "incident", "snooze"):
        assert UNREADABLE.counts[kind] > before[kind], kind
