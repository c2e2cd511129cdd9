"""Warn before you act, end to end on a real nats-server: the engine learns each warning's outcome from the runner's
audit record (a real SMTP server that refuses one recipient), and the staged command runs only where it was
delivered; the refusal is in the audit and in the engine's status."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Iterator, Sized
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import pytest
from aiosmtpd.controller import Controller

from actions.runner import ActionRunner
from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.clock import ManualClock
from gpuevents.config import Config, NatsConfig
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, make_event
from gpuevents.records import AuditRecord, decode_audit
from gpuevents.server import free_port
from rules.core.warning_ledger import NOT_DELIVERED
from rules.engine.service import Engine
from tests.actions.builtin.test_email import Inbox
from tests.rules.engine.conftest import T0
from tests.rules.engine.helpers import running
from tests.waiting import wait_for

Sized_ = TypeVar("Sized_", bound=Sized)

RULE = """\
rules:
  - name: idle-warn-then-act
    entity: gpu
    when: gpu.idle and gpu.processes
    actions:
      - {type: email, to: "{{ gpu.owner }}", subject: "GPU {{ gpu.index }} idle", text: "acting in 30m"}
      - type: command
        after: 30m
        argv: ["PYTHON", "-c", "import sys; open(sys.argv[1], 'w').write('acted')", "MARKERS/gpu{{ gpu.index }}"]
"""


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    inbox.refuse.add("ghost@example.org")
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


@pytest.fixture
def config(nats_config: NatsConfig, tmp_path: Path, smtp: tuple[Inbox, int]) -> Config:
    rules, markers = tmp_path / "rules", tmp_path / "markers"
    rules.mkdir()
    markers.mkdir()
    (rules / "r.yaml").write_text(RULE.replace("PYTHON", sys.executable).replace("MARKERS", str(markers)))
    return Config.model_validate({
        "cluster": "c1", "nats": nats_config.model_dump(),
        "engine": {"rules": [str(rules)], "tick": "30s", "lease_ttl": "10s",
                   "usage_db": str(tmp_path / "usage.sqlite")},
        "agent": {"snapshot_interval": "1h"},
        "owners": {"alice": "alice@example.org", "ghost": "ghost@example.org"},
        "actions": {"email": {"host": "127.0.0.1", "port": smtp[1]},
                    "retry": {"max_attempts": 2, "backoff": 0.05, "backoff_max": 0.1}},
    })


def two_gpus(clock: ManualClock) -> NodeSnapshot:
    """GPU 0 idle, held by alice; GPU 1 idle, held by ghost (whose mail the SMTP server refuses)."""
    now = clock.now()
    gpus = [GpuInfo(node="n1", index=i, uuid=f"GPU-{i}", util_pct=0, mem_used_mib=1000, mem_total_mib=81559,
                    idle=True, idle_since=now, pids=[100 + i]) for i in (0, 1)]
    procs = [ProcessInfo(node="n1", pid=100 + i, name="python", user=u, create_time=now - timedelta(hours=1),
                         gpus=[i]) for i, u in ((0, "alice"), (1, "ghost"))]
    return NodeSnapshot(node=NodeInfo(name="n1", cluster="c1", gpu_count=2), gpus=gpus, processes=procs)


@pytest.fixture
async def runner(bus: Bus, config: Config) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task((await ActionRunner.open(bus, config, ManualClock(T0))).run(stop))
    yield
    stop.set()
    await asyncio.wait_for(task, 30)


async def actions(bus: Bus) -> list[AuditRecord]:
    return [r async for m in bus.replay(S.STREAM_AUDIT, S.AUDIT_ALL) for r in decode_audit(m.data)
            if r.kind == "action"]


async def test_the_staged_command_runs_where_the_warning_was_delivered_and_is_refused_where_not(
        config: Config, bus: Bus, runner: None, tmp_path: Path) -> None:
    clock = ManualClock(T0)
    markers = tmp_path / "markers"
    async with running(await Engine.open(config, bus, clock=clock)) as engine:
        bus.publish_event(make_event("node.snapshot", "n1", two_gpus(clock), cluster="c1", time=clock.now()))

        async def mailed() -> dict[str, str | None]:
            return {r.entity_id: r.outcome for r in await actions(bus) if r.action_type == "email"}

        await wait_for(lambda: _len(mailed(), 2), timeout=30, what="both warnings' outcomes")
        assert await mailed() == {"n1/gpu0": "ok", "n1/gpu1": "failed"}

        def learned() -> dict[str, list[str]]:
            return {i.entity_id: [w.status for w in i.warnings.values()] for i in engine.core.open_incidents()}

        await wait_for(lambda: learned() == {"n1/gpu0": ["delivered"], "n1/gpu1": ["failed"]},
                       what="the engine to learn both outcomes from the audit")
        _nodes, incidents = (await engine.answers.read_model()).node("n1")
        assert {i.entity_id: i.warning for i in incidents} == {
            "n1/gpu0": None, "n1/gpu1": f"{NOT_DELIVERED} (email failed)"}

        clock.advance(1801)
        await engine.tick()

        async def commands() -> dict[str, AuditRecord]:
            return {r.entity_id: r for r in await actions(bus) if r.action_type == "command"}

        done = await wait_for(lambda: _len(commands(), 2), timeout=30, what="both staged commands decided")
        assert done["n1/gpu0"].outcome == "ok" and (markers / "gpu0").read_text() == "acted"
        assert done["n1/gpu1"].outcome == "refused" and not (markers / "gpu1").exists()
        assert f"{NOT_DELIVERED} (email failed)" in (done["n1/gpu1"].error or done["n1/gpu1"].detail or "")


async def test_an_engine_that_takes_over_learns_the_outcomes_reported_while_none_was_acting(
        config: Config, bus: Bus) -> None:
    clock = ManualClock(T0)
    async with running(await Engine.open(config, bus, clock=clock)) as first:
        bus.publish_event(make_event("node.snapshot", "n1", two_gpus(clock), cluster="c1", time=clock.now()))
        await wait_for(lambda: len(first.core.open_incidents()) == 2,
                       what="both incidents firing")
        await first.settle()  # the warnings, `sent`, are stored with the incidents
    stop = asyncio.Event()  # no engine acts while the runner delivers one warning and fails the other
    task = asyncio.create_task((await ActionRunner.open(bus, config, clock)).run(stop))
    await wait_for(lambda: _len(actions(bus), 2), timeout=30, what="both warnings' outcomes")
    stop.set()
    await asyncio.wait_for(task, 30)
    async with running(await Engine.open(config, bus, clock=clock)) as second:
        learned = {i.entity_id: [w.status for w in i.warnings.values()] for i in second.core.open_incidents()}
        assert learned == {"n1/gpu0": ["delivered"], "n1/gpu1": ["failed"]}


async def _len(coro: Awaitable[Sized_], n: int) -> Sized_ | None:
    got = await coro
    return got if len(got) >= n else None


async def test_a_learned_outcome_is_in_the_next_read_model_not_an_older_one(config: Config, bus: Bus) -> None:
    """Status and the dashboard read a model that saw every change of the core: learning a warning's outcome
    from the audit is one (it was not counted, so a model built before it was served on: the warning said no
    outcome was known after the engine had learned the mail failed, seen under load)."""
    clock = ManualClock(T0)
    async with running(await Engine.open(config, bus, clock=clock)) as engine:
        bus.publish_event(make_event("node.snapshot", "n1", two_gpus(clock), cluster="c1", time=clock.now()))
        await wait_for(lambda: len(engine.core.open_incidents()) == 2,
                       what="both incidents firing")
        await engine.settle()
        _nodes, before = (await engine.answers.read_model()).node("n1")
        assert all(i.warning is not None and "no outcome known" in i.warning for i in before), before
        stop = asyncio.Event()
        task = asyncio.create_task((await ActionRunner.open(bus, config, clock)).run(stop))
        try:
            await wait_for(lambda: sorted(
                w.status for i in engine.core.open_incidents() for w in i.warnings.values()) == ["delivered", "failed"],
                timeout=30, what="the engine to learn both outcomes from the audit")
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
        _nodes, after = (await engine.answers.read_model()).node("n1")
        assert {i.entity_id: i.warning for i in after} == {"n1/gpu0": None,
                                                           "n1/gpu1": f"{NOT_DELIVERED} (email failed)"}
