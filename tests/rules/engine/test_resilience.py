"""The engine keeps watching the fleet through a poison event, a bus that refuses writes, and a bad reload."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gpuevents import subjects as S
from gpuevents.bus import Bus, BusError, Delivery
from gpuevents.clock import ManualClock, SystemClock
from gpuevents.config import Config
from gpuevents.records import decode_audit
from gpuevents.server import EmbeddedServer
from rules.core.core import Core
from rules.engine.partitions.lease import Lease
from rules.engine.service import Engine
from tests.rules.engine.conftest import T0, snapshot
from tests.rules.engine.helpers import incident, publish, running
from tests.waiting import wait_for


async def test_an_event_the_core_cannot_apply_is_dead_lettered_and_the_next_is_processed(
    engine_config: Config, bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_step = Core._step  # what step and step_batch both go through

    def step(self: Core, item: Any, now: Any) -> Any:
        if getattr(item, "source", "") == "node/poison":
            raise RuntimeError("a bug in the core")
        return real_step(self, item, now)

    monkeypatch.setattr(Core, "_step", step)
    async with running(await Engine.open(engine_config, bus, clock=ManualClock(T0))) as engine:
        await publish(bus, snapshot("poison", T0), snapshot("n1", T0))
        await wait_for(lambda: incident(engine, "n1/gpu0"), what="the event after the poison one")

        async def dead() -> list[str]:  # the dead letter is published beside the batch, not before it
            return [m.subject async for m in bus.replay(S.STREAM_DLQ, S.DLQ_ALL)]

        assert await wait_for(dead, what="the poison event dead-lettered") == [
            "gpuevents.dlq.evt.c1.poison.node.snapshot"]
        assert engine.dead_letters.seen == {"unapplicable": 1}


async def test_a_commit_the_bus_refuses_is_retried_not_fatal(
    engine_config: Config, bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Bus.js_publish_many
    refusals = {"left": 2}

    async def flaky(self: Bus, items: Any) -> Any:
        if refusals["left"] > 0:
            refusals["left"] -= 1
            raise BusError("JetStream is not answering")
        return await real(self, items)

    monkeypatch.setattr(Bus, "js_publish_many", flaky)
    clock = ManualClock(T0)
    async with running(await Engine.open(engine_config, bus, clock=clock)) as engine:
        await publish(bus, snapshot("n1", T0))
        await wait_for(lambda: incident(engine, "n1/gpu0"), what="a pending incident")
        await engine.settle()
        assert refusals["left"] == 0
        assert engine.metrics.bus_retries._value.get() >= 2
        kv = await bus.kv()
        assert await kv.keys("incident.")  # the pending incident was persisted in the end


async def test_a_commit_whose_acks_were_lost_is_sent_again_and_stored_once(
    engine_config: Config, bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bus stored the batch's audit but the acks never came: the retry sends the same messages, and
    JetStream's dedup keeps one copy. The batch's transitions of one rule travel as one audit message."""
    real = Bus.js_publish_many
    lost = {"left": 1}

    async def acks_lost(self: Bus, items: Any) -> Any:
        results = await real(self, items)
        if lost["left"] > 0 and any(it.subject.startswith("gpuevents.audit.") for it in items):
            lost["left"] -= 1
            raise BusError("no acks within the timeout")
        return results

    batches: list[int] = []
    real_handle = Engine.handle

    async def handle(self: Engine, deliveries: list[Delivery]) -> None:
        batches.append(len(deliveries))
        await real_handle(self, deliveries)

    monkeypatch.setattr(Bus, "js_publish_many", acks_lost)
    monkeypatch.setattr(Engine, "handle", handle)
    nodes = [f"n{i}" for i in range(5)]
    await publish(bus, *(snapshot(n, T0) for n in nodes))  # before the engine starts: one batch, as a rule
    async with running(await Engine.open(engine_config, bus, clock=ManualClock(T0))) as engine:
        await wait_for(lambda: all(incident(engine, f"{n}/gpu0") for n in nodes), what="five pending incidents")
        await engine.settle()
        assert lost["left"] == 0 and engine.metrics.bus_retries._value.get() >= 1
    messages = [m async for m in bus.replay(S.STREAM_AUDIT, S.audit_subject("idle-gpu-1h"))]
    records = [r for m in messages for r in decode_audit(m.data)]
    assert sum(batches) == len(nodes)
    assert len(messages) == len(batches)  # one (a loaded machine may fetch the five in two batches)
    assert sorted(r.entity_id for r in records) == [f"{n}/gpu0" for n in nodes]
    assert {(r.from_status, r.to_status) for r in records} == {("inactive", "pending")}


async def test_an_unexpected_reload_failure_keeps_the_rules(
    engine_config: Config, bus: Bus, rules_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(await Engine.open(engine_config, bus, clock=ManualClock(T0))) as engine:
        def broken(*a: Any, **k: Any) -> Any:
            raise RuntimeError("a bug in the loader")

        monkeypatch.setattr("rules.engine.rulefiles.load_checked", broken)
        (rules_dir / "more.yaml").write_text("rules: []\n")
        await wait_for(lambda: engine.metrics.reloads.labels(result="failed")._value.get() >= 1,
                       what="the failed reload to be counted")
        assert list(engine.core.rules.by_name) == ["idle-gpu-1h"]
        assert engine.leader.is_set()


async def test_an_engine_rides_out_a_nats_outage_longer_than_its_lease(
    engine_config: Config, nats_server: EmbeddedServer, tmp_path: Path
) -> None:
    """With NATS down for several lease periods, the engine stops acting but keeps running, reconnects, takes
    the lease back and consumes again (it used to stop, exiting 0)."""
    cfg = engine_config.model_copy(update={"engine": engine_config.engine.model_copy(update={"lease_ttl": 1.0})})
    bus = Bus(cfg.nats, name="outage")
    await bus.connect()
    await bus.ensure_streams()
    stop = asyncio.Event()
    engine = await Engine.open(cfg, bus, clock=SystemClock())
    task = asyncio.create_task(engine.run(stop))
    try:
        await wait_for(lambda: engine.leader.is_set(), what="the engine to lead")
        nats_server.stop()
        await wait_for(lambda: not engine.leader.is_set(), timeout=15, what="the engine to stop acting")
        assert not task.done()
        nats_server.start()
        await wait_for(lambda: engine.leader.is_set(), timeout=30, what="the engine to take the lease back")
        assert not task.done()
        bus.publish_event(snapshot("after-outage", SystemClock().now()))
        await wait_for(lambda: any(n.name == "after-outage" for n in engine.core.nodes()),
                       timeout=15, what="an event consumed after the outage")
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await bus.close(flush_timeout=1)


async def test_a_commit_still_retrying_when_the_lease_comes_back_is_in_the_restored_core(
        engine_config: Config, bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease lapses while a batch's commit is still retrying (the KV bucket's leader is being elected), and
    comes back: the take-over restores from KV only once that commit went through, so the incident it writes
    (and the event it then acknowledges, never to come again) is in the acting core. Before, the core was
    rebuilt from KV first and the late commit's incident lived in KV only: the node dropped out of the engine's
    watch until its next snapshot (test_replica.py's server death timed out this way under load)."""
    ttl = engine_config.engine.model_copy(update={"lease_ttl": 0.3})
    async with running(await Engine.open(engine_config.model_copy(update={"engine": ttl}), bus,
                              clock=ManualClock(T0))) as engine:
        store = engine.committer.stores.incidents
        refused: list[object] = []
        may_write = asyncio.Event()
        save_many = store.save_many

        async def unreachable_until_allowed(items: Any) -> None:
            if not may_write.is_set():
                refused.append(items)
                raise BusError("updating incident.x failed: NoStreamResponseError: nats: no response from stream")
            await save_many(items)

        monkeypatch.setattr(store, "save_many", unreachable_until_allowed)
        steps: list[str] = []
        tick = Lease.tick

        async def lapse_once(lease: Lease, may_acquire: bool = True) -> bool:
            if len(refused) >= 3 and not steps:
                steps.append("lapsed")
                return False
            if steps == ["lapsed"] and not engine.leader.is_set():
                steps.append("taken back")  # from here the commit's next try goes through
                may_write.set()
            return await tick(lease, may_acquire)

        monkeypatch.setattr(Lease, "tick", lapse_once)
        await publish(bus, snapshot("n1", T0))
        await wait_for(lambda: steps == ["lapsed", "taken back"] and engine.leader.is_set(),
                       what="the lease to lapse and come back while the commit retries")
        await engine.settle()
        assert incident(engine, "n1/gpu0") is not None, "the late commit's incident is not in the acting core"
        stored = await store.load()
        assert [i.entity_id for i in stored.values()] == ["n1/gpu0"]
