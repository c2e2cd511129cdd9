"""The engine against a real nats-server: end to end, restarts, duplicates, dead letters, reload, lease."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from actions.runner import ActionRunner
from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.clock import ManualClock, SystemClock
from gpuevents.config import Config
from gpuevents.events import encode_event
from gpuevents.records import AuditRecord
from rules.engine.partitions.lease import LEASE_KEY, Lease, LeaseRecord
from rules.engine.service import Engine
from tests.rules.engine.conftest import T0, snapshot
from tests.rules.engine.helpers import act_requests, audit_records, crash, incident, publish, running, seen
from tests.waiting import wait_for


async def test_snapshot_to_incident_to_action_to_audit(engine_config: Config, bus: Bus) -> None:
    clock = ManualClock(T0)
    engine = await Engine.open(engine_config, bus, clock=clock)
    runner = await ActionRunner.open(bus, engine_config, clock)
    stop_runner = asyncio.Event()
    runner_task = asyncio.create_task(runner.run(stop_runner))
    try:
        async with running(engine):
            await publish(bus, snapshot("n1", T0))
            await wait_for(lambda: incident(engine, "n1/gpu0"), what="a pending incident")
            assert incident(engine, "n1/gpu0").status == "pending"
            clock.advance(3601)
            await engine.tick()
            assert incident(engine, "n1/gpu0").status == "firing"

            async def action_audited() -> list[AuditRecord]:
                return [r for r in await audit_records(bus) if r.kind == "action"]

            records = await wait_for(action_audited, what="the action's audit record")
    finally:
        stop_runner.set()
        await asyncio.wait_for(runner_task, 10)
    assert records[0].outcome == "ok"
    assert records[0].action_type == "log"
    assert records[0].rule == "idle-gpu-1h"
    assert records[0].entity_id == "n1/gpu0"
    assert "alice@example.com" in (records[0].detail or "")
    transitions = [(r.from_status, r.to_status) for r in await audit_records(bus) if r.kind == "transition"]
    assert ("inactive", "pending") in transitions and ("pending", "firing") in transitions


async def test_restart_in_the_middle_of_for_fires_at_the_original_deadline_once(jetstream: JetStreamContext,
    engine_config: Config, bus: Bus
) -> None:
    clock = ManualClock(T0)
    async with running(await Engine.open(engine_config, bus, clock=clock)) as first:
        await publish(bus, snapshot("n1", T0))
        await wait_for(lambda: incident(first, "n1/gpu0"), what="a pending incident")
        started = incident(first, "n1/gpu0").active_at
    clock.advance(1800)
    async with running(await Engine.open(engine_config, bus, clock=clock)) as second:
        restored = incident(second, "n1/gpu0")
        assert restored is not None and restored.status == "pending" and restored.active_at == started
        await publish(bus, snapshot("n1", clock.now(), idle_since=T0))
        await wait_for(lambda: seen(second, "n1", clock.now()), what="the snapshot to be consumed")
        clock.set(T0 + timedelta(minutes=59))
        await second.tick()
        assert incident(second, "n1/gpu0").status == "pending"
        clock.set(T0 + timedelta(hours=1, seconds=1))
        await second.tick()
        assert incident(second, "n1/gpu0").status == "firing"
    assert len(await act_requests(jetstream)) == 1
    clock.advance(60)
    async with running(await Engine.open(engine_config, bus, clock=clock)) as third:
        assert incident(third, "n1/gpu0").status == "firing"
        await publish(bus, snapshot("n1", clock.now(), idle_since=T0))
        await wait_for(lambda: seen(third, "n1", clock.now()), what="the snapshot to be consumed")
        await third.tick()
    assert len(await act_requests(jetstream)) == 1  # a fired action is not fired again


async def test_the_same_event_delivered_twice_changes_nothing(jetstream: JetStreamContext, engine_config: Config,
                                                              bus: Bus) -> None:
    clock = ManualClock(T0)
    first = snapshot("n1", T0)
    async with running(await Engine.open(engine_config, bus, clock=clock)) as engine:
        await publish(bus, first)
        await wait_for(lambda: incident(engine, "n1/gpu0"), what="a pending incident")
        clock.advance(7200)
        await engine.tick()
        fired = incident(engine, "n1/gpu0")
        assert fired.status == "firing"
        before = len(await audit_records(bus))
        # a redelivery (as after a crash before the ack): same event, new stream message
        await bus.js_publish(S.event_subject("c1", "n1", "node.snapshot"), encode_event(first),
                             msg_id="redelivery-1")
        marker = snapshot("n2", clock.now(), pid=None)  # matches no rule
        await publish(bus, marker)  # consumed after the redelivery, in stream order
        await wait_for(lambda: seen(engine, "n2", clock.now()), what="the redelivered event to be consumed")
        assert incident(engine, "n1/gpu0") == fired
        assert len(await audit_records(bus)) == before
    assert len(await act_requests(jetstream)) == 1


async def test_a_malformed_event_goes_to_the_dlq_and_the_next_is_processed(
    engine_config: Config, bus: Bus
) -> None:
    clock = ManualClock(T0)
    async with running(await Engine.open(engine_config, bus, clock=clock)) as engine:
        await bus.js_publish(S.event_subject("c1", "n1", "gpu.idle"), b'{"type": "gpu.idle", "oops": 1}')
        await bus.js_publish(S.event_subject("c1", "n1", "gpu.idle"), b"\xff not json")
        await publish(bus, snapshot("n2", T0))
        await wait_for(lambda: incident(engine, "n2/gpu0"), what="the good event after the bad ones")
        dead = [m async for m in bus.replay(S.STREAM_DLQ, S.DLQ_ALL)]
        assert len(dead) == 2
        assert dead[0].subject == "gpuevents.dlq.evt.c1.n1.gpu.idle"
        assert dead[1].data == b"\xff not json"
        assert sum(engine.dead_letters.seen.values()) == 2
        total = sum(s.value for m in engine.metrics.malformed.collect() for s in m.samples
                    if s.name.endswith("_total"))
        assert total == 2


async def test_a_reload_with_a_broken_file_keeps_the_old_rules(
    engine_config: Config, bus: Bus, rules_dir: Path
) -> None:
    clock = ManualClock(T0)
    async with running(await Engine.open(engine_config, bus, clock=clock)) as engine:
        await publish(bus, snapshot("n1", T0))
        await wait_for(lambda: incident(engine, "n1/gpu0"), what="a pending incident")
        pending = incident(engine, "n1/gpu0")
        good = (rules_dir / "idle.yaml").read_text()
        (rules_dir / "idle.yaml").write_text(good + "  - name: Bad Name\n    entity: gpu\n")
        assert await engine.reload() is False
        assert list(engine.core.rules.by_name) == ["idle-gpu-1h"]
        (rules_dir / "more.yaml").write_text(
            "rules:\n  - name: hot-gpu\n    entity: gpu\n    when: gpu.temp_c > 85\n"
            "    actions: [{type: log, message: hot}]\n")
        (rules_dir / "idle.yaml").write_text(good)
        assert await engine.reload() is True
        assert sorted(engine.core.rules.by_name) == ["hot-gpu", "idle-gpu-1h"]
        assert incident(engine, "n1/gpu0") == pending  # the unchanged rule kept its incident


async def test_a_rule_file_change_is_picked_up_without_a_signal(
    engine_config: Config, bus: Bus, rules_dir: Path
) -> None:
    async with running(await Engine.open(engine_config, bus, clock=ManualClock(T0))) as engine:
        (rules_dir / "more.yaml").write_text(
            "rules:\n  - name: hot-gpu\n    entity: gpu\n    when: gpu.temp_c > 85\n"
            "    actions: [{type: log, message: hot}]\n")
        await wait_for(lambda: "hot-gpu" in engine.core.rules.by_name,
                       timeout=10, what="the new rule file to be loaded")


async def test_a_standby_engine_takes_over_when_the_leader_dies(engine_config: Config, bus: Bus,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """On a virtual clock both engines share: the dead leader's lease holds until its expiry, however often the
    standby tries, and the standby takes it at the first try after it (never both leading at once)."""
    ttl = 1.0
    cfg = engine_config.model_copy(update={"engine": engine_config.engine.model_copy(update={"lease_ttl": ttl})})
    clock = ManualClock(T0)
    a = await Engine.open(cfg, bus, clock=clock, holder="a")
    b = await Engine.open(cfg, bus, clock=clock, holder="b")
    both: list[bool] = []
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    task_a = asyncio.create_task(a.run(stop_a))
    await wait_for(lambda: a.leader.is_set(), what="a to lead")
    task_b = asyncio.create_task(b.run(stop_b))
    tries: list[str | None] = []
    real_tick = Lease.tick

    async def counted_tick(lease: Lease, may_acquire: bool = True) -> bool:
        tries.append(lease.holder)
        held = await real_tick(lease, may_acquire)
        both.append(a.leader.is_set() and b.leader.is_set())
        return held

    monkeypatch.setattr(Lease, "tick", counted_tick)
    await wait_for(lambda: tries.count("b") >= 4, what="b to try for the lease a few times")
    assert not b.leader.is_set()
    await crash(task_a)
    expiry = T0 + timedelta(seconds=ttl)  # a renewed it on a clock that stood at T0
    before = tries.count("b")
    await wait_for(lambda: tries.count("b") >= before + 4, what="b to try again after a died")
    assert not b.leader.is_set(), "b took a lease that had not expired"
    clock.set(expiry)
    await wait_for(lambda: b.leader.is_set(), what="b to take over at the lease's expiry")
    entry = await (await bus.kv()).get(LEASE_KEY)
    assert entry is not None
    record = LeaseRecord.model_validate_json(entry.value)
    assert (record.holder, record.acquired_at) == ("b", expiry)
    await publish(bus, snapshot("n9", clock.now()))
    await wait_for(lambda: any(n.name == "n9" for n in b.core.nodes()),
                   what="b to consume after taking over")
    stop_b.set()
    await task_b
    assert not any(both), "both engines acted at once"


async def test_a_rate_limit_window_survives_an_engine_restart(jetstream: JetStreamContext, engine_config: Config,
                                                              bus: Bus, rules_dir: Path) -> None:
    """With max_per_hour: 1, a restart (a crash loop, a failover) must not let a second run through."""
    (rules_dir / "idle.yaml").write_text("""\
rules:
  - name: idle-log-once-an-hour
    entity: gpu
    when: gpu.idle and gpu.processes
    limits: {max_per_hour: 1}
    actions: [{type: log, message: "{{ entity.id }}"}]
""")
    clock = ManualClock(T0)
    async with running(await Engine.open(engine_config, bus, clock=clock)) as first:
        await publish(bus, snapshot("n1", T0))
        await wait_for(lambda: incident(first, "n1/gpu0"), what="n1 to fire")
        await first.settle()
    clock.advance(120)
    async with running(await Engine.open(engine_config, bus, clock=clock)) as second:
        await publish(bus, snapshot("n1", clock.now(), idle_since=T0), snapshot("n2", clock.now()))
        await wait_for(lambda: incident(second, "n2/gpu0"), what="n2 to fire")
        await second.settle()
    decisions = sorted((r.entity_id, r.decision) for r in await act_requests(jetstream))
    assert decisions == [("n1/gpu0", "run"), ("n2/gpu0", "suppressed")]


async def test_a_for_deadline_wakes_the_engine_at_its_instant(engine_config: Config, bus: Bus,
                                                              rules_dir: Path) -> None:
    """A `for` started by an event fires at its deadline, and a repeat at its instant, not up to a tick or a
    snapshot interval later (`for: 80s` fired 13 s late; a 15 s repeat came after 21.6 s). On a virtual clock: the
    engine plans its wake-up for the deadline itself (the periodic tick is an hour, so a late engine would time
    out), and fires when the clock reaches it, exactly 2 s after the incident went pending."""
    (rules_dir / "idle.yaml").write_text("""\
rules:
  - name: idle-2s
    entity: gpu
    when: gpu.idle and gpu.processes
    for: 2s
    repeat: 2s
    actions: [{type: log, message: "{{ entity.id }}"}]
""")
    cfg = engine_config.model_copy(update={"engine": engine_config.engine.model_copy(update={"tick": 3600})})
    clock = ManualClock(T0)
    async with running(await Engine.open(cfg, bus, clock=clock)) as engine:
        await publish(bus, snapshot("n1", T0))
        await wait_for(lambda: incident(engine, "n1/gpu0"), what="the pending incident")
        assert incident(engine, "n1/gpu0").status == "pending"
        deadline = T0 + timedelta(seconds=2)
        await wait_for(lambda: engine.planner.planned == deadline.timestamp(),
                       what="the engine to plan its wake-up at the for deadline")
        clock.set(deadline)
        await wait_for(lambda: incident(engine, "n1/gpu0").status == "firing", timeout=10,
                       what="the engine to wake at the for deadline")
        inc = incident(engine, "n1/gpu0")
        assert (inc.active_at, inc.fired_at, inc.last_sent_at) == (T0, deadline, deadline)
        repeat = deadline + timedelta(seconds=2)
        await wait_for(lambda: engine.planner.planned == repeat.timestamp(),
                       what="the engine to plan its wake-up at the repeat")
        clock.set(repeat)
        await wait_for(lambda: incident(engine, "n1/gpu0").last_sent_at == repeat, timeout=10,
                       what="the repeat at its instant")


async def test_an_envelope_that_names_another_node_than_its_subject_is_dead_lettered(
        engine_config: Config, bus: Bus) -> None:
    """A stolen agent login is fenced to its node's subjects; it must not drive another node by writing that
    node's name into `source`."""
    clock = ManualClock(T0)
    async with running(await Engine.open(engine_config, bus, clock=clock)) as engine:
        spoof = snapshot("sim-000", T0)
        await bus.js_publish(S.event_subject("c1", "node-a", "node.snapshot"), encode_event(spoof), msg_id=spoof.id)
        await publish(bus, snapshot("node-a", T0))
        await wait_for(lambda: seen(engine, "node-a", T0), what="node-a's own snapshot")
        assert [n.name for n in engine.core.nodes()] == ["node-a"]
        assert incident(engine, "sim-000/gpu0") is None
        assert engine.metrics.malformed.labels(kind="spoofed")._value.get() == 1
    stored = [m async for m in bus.replay(S.STREAM_DLQ, S.DLQ_ALL)]
    assert len(stored) == 1


async def test_a_snapshot_dated_1970_does_not_fire_an_idle_rule_at_once(engine_config: Config, bus: Bus,
                                                                        rules_dir: Path) -> None:
    (rules_dir / "idle.yaml").write_text("""\
rules:
  - name: idle-1h
    entity: gpu
    when: gpu.idle_for_s > 3600
    actions: [{type: log, message: "{{ entity.id }}"}]
""")
    async with running(await Engine.open(engine_config, bus, clock=SystemClock())) as engine:
        epoch = datetime(1970, 1, 1, 0, 5, tzinfo=UTC)
        await publish(bus, snapshot("n1", epoch, idle_since=epoch - timedelta(minutes=5)))
        await wait_for(lambda: engine.core.gpus(), what="the snapshot")
        await engine.settle()
        gpu = engine.core.gpus()[0]
        assert 290 <= gpu.idle_for_s <= 400  # idle for five minutes, by the agent's own account
        assert incident(engine, "n1/gpu0") is None
        assert engine.metrics.clock_skew._value.get() == 1
