"""`gpuevents status` on a large fleet, over a real nats-server: bounded answers, pages that return every node once,
and an engine that keeps consuming while the fleet is read."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import orjson
import pytest
from msgspec.structs import replace

from gpuevents import agentdata
from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.cli.ask_status import ask_node, ask_pages, ask_summary
from gpuevents.clock import ManualClock
from gpuevents.config import Config
from gpuevents.events import Event, GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, make_event
from gpuevents.wire import StatusQuery
from gpuevents.wire.status import TOP, StatusSummary
from rules.engine.read import slices
from rules.engine.service import Engine
from tests.rules.engine.conftest import T0, snapshot
from tests.rules.engine.helpers import publish, running
from tests.waiting import wait_for

FLEET = 2_000
GPUS = 2


def big_snapshot(i: int) -> Event:
    """Node i with GPUS GPUs: GPU 0 held idle by a process for two hours (the rule fires), the others busy."""
    name = f"gpu-{i:05d}"
    gpus = [GpuInfo(node=name, index=g, uuid=f"GPU-{name}-{g}", model="NVIDIA H100 80GB HBM3",
                    util_pct=0.0 if g == 0 else 90.0, mem_used_mib=20000, mem_total_mib=81559, power_w=300.0,
                    idle=g == 0, idle_since=T0 - timedelta(hours=2) if g == 0 else None,
                    pids=[1000 + g], owners=["alice"]) for g in range(GPUS)]
    procs = [ProcessInfo(node=name, pid=1000 + g, name="python", user="alice",
                         create_time=T0 - timedelta(hours=3), gpus=[g], gpu_mem_mib=20000) for g in range(GPUS)]
    snap = NodeSnapshot(node=NodeInfo(name=name, cluster="c1", gpu_count=GPUS), gpus=gpus, processes=procs)
    return make_event("node.snapshot", name, snap, cluster="c1", time=T0)


HELD_RULE = """\
rules:
  - name: held-idle
    entity: gpu
    when: gpu.idle and gpu.processes
    actions:
      - type: log
        message: "GPU {{ gpu.index }} on {{ node.name }} held idle"
"""


def known(engine: Engine, name: str) -> bool:
    """Whether the engine's core has taken in a snapshot of that node."""
    return any(ns.name == name for ns in engine.core.state.nodes.values())


@pytest.fixture
def rules_dir(rules_dir: Path) -> Path:
    """The engine tests' rule (idle-gpu-1h, pending for an hour) and one that fires at once (held-idle)."""
    (rules_dir / "held.yaml").write_text(HELD_RULE)
    return rules_dir


@pytest.fixture
async def big_engine(engine_config: Config, bus: Bus) -> AsyncIterator[Engine]:
    """An acting engine whose core holds FLEET simulated nodes, stepped into it directly (no agents), node i at
    T0 + i/2 s (so the earlier nodes' incidents have cost more); its clock half an hour on."""
    clock = ManualClock(T0)
    async with running(await Engine.open(engine_config, bus, clock=clock)) as engine:
        async with engine.hold.held() as core:
            for i in range(FLEET):
                core.step(big_snapshot(i), T0 + timedelta(seconds=i / 2))
            engine.hold.changed()
        clock.set(T0 + timedelta(minutes=30))
        yield engine


async def test_a_large_fleets_summary_is_small_and_ranks_what_costs_most(big_engine: Engine, bus: Bus) -> None:
    raw = await bus.request(S.ENGINE_STATUS, b"{}", timeout=60)
    assert len(raw) < bus.max_payload // 10
    st = StatusSummary.model_validate_json(raw)
    s = st.summary
    assert (s.nodes, s.gpus, s.held_idle, s.busy) == (FLEET, FLEET * GPUS, FLEET, FLEET)
    assert (s.incidents_firing, s.incidents_pending) == (FLEET, FLEET)
    assert [(i.rule, i.entity_id) for i in st.incidents] == [  # the most costly: held idle the longest
        ("held-idle", f"gpu-{i:05d}/gpu0") for i in range(TOP)]
    assert all(a.cost_value > b.cost_value for a, b in zip(st.incidents, st.incidents[1:], strict=False))  # type: ignore[operator]  # all priced here
    assert len(st.incidents) == TOP and st.incidents_more == FLEET - TOP
    assert len(st.worst_nodes) == TOP and {w.held_idle for w in st.worst_nodes} == {1}
    merged = await ask_summary(bus, top=5)
    assert merged is not None and len(merged.incidents) == 5 and merged.incidents_more == FLEET - 5


async def test_pages_are_under_the_max_payload_and_return_every_node_once(big_engine: Engine, bus: Bus) -> None:
    sizes: list[int] = []
    versions: set[int] = set()
    offset: int | None = 0
    while offset is not None:  # as ask_pages asks, keeping the raw replies to weigh them
        q = StatusQuery(view="nodes", offsets={"all": offset}, max_bytes=bus.max_payload,
                        versions={"all": next(iter(versions))} if versions else {})
        page = orjson.loads(await bus.request(S.ENGINE_STATUS, q.model_dump_json().encode(), timeout=60))
        sizes.append(len(orjson.dumps(page)))
        versions.add(page["version"])
        offset = page["next"]
    assert len(sizes) > 1 and max(sizes) < bus.max_payload
    assert sum(sizes) > bus.max_payload  # the whole fleet in one reply would not have gone through
    assert len(versions) == 1
    names = Counter([n.name async for page in ask_pages(bus) for n in page.nodes])
    assert names == Counter({f"gpu-{i:05d}": 1 for i in range(FLEET)})
    incidents = Counter([(i.rule, i.entity_id) async for page in ask_pages(bus, "incidents") for i in page.incidents])
    assert incidents == Counter({(r, f"gpu-{i:05d}/gpu0"): 1 for i in range(FLEET) for r in ("held-idle",
                                                                                          "idle-gpu-1h")})


async def test_pages_come_from_one_read_model_while_the_fleet_changes(big_engine: Engine, bus: Bus) -> None:
    pages = ask_pages(bus)
    first = await anext(pages)
    await publish(bus, snapshot("aaa-new", T0))  # sorts first: a fresh model would shift every later page
    await wait_for(lambda: known(big_engine, "aaa-new"), what="the new node consumed")
    rest = [n.name async for page in pages for n in page.nodes]
    names = [n.name for n in first.nodes] + rest
    assert "aaa-new" not in names and len(names) == len(set(names)) == FLEET
    found = await ask_node(bus, "aaa-new")
    assert found is not None and [n.name for n in found.nodes] == ["aaa-new"]


async def test_the_engine_consumes_while_a_status_is_being_built(big_engine: Engine, bus: Bus,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A status request's read model is built in slices: between two of them, events are consumed. The build is
    held at its first pause until the events published meanwhile have all been applied to the core."""
    held, release = asyncio.Event(), asyncio.Event()
    pause = slices.Slicer.pause

    async def gated(self: slices.Slicer) -> None:
        held.set()
        await release.wait()
        await pause(self)

    monkeypatch.setattr(slices.Slicer, "pause", gated)
    asking = asyncio.create_task(ask_summary(bus, timeout=60))
    await wait_for(held.is_set, what="the read model's build to pause")
    late = [f"late-{i:02d}" for i in range(20)]
    await publish(bus, *(snapshot(n, T0) for n in late))
    await wait_for(lambda: all(known(big_engine, n) for n in late), what="the late events consumed")
    assert not asking.done()
    release.set()
    answered = await asking
    assert answered is not None and answered.summary.nodes >= FLEET
    monkeypatch.setattr(slices.Slicer, "pause", pause)
    after = await ask_summary(bus, timeout=60)  # asked after the late events: it counts them
    assert after is not None and after.summary.nodes == FLEET + len(late)


async def test_free_answers_a_large_fleet_within_the_max_payload(big_engine: Engine, bus: Bus) -> None:
    async with big_engine.hold.held() as core:
        for i in range(FLEET):  # every GPU free: a full answer would list 2,000 nodes, over 1 MiB
            e = big_snapshot(i)
            assert isinstance(e.data, agentdata.NodeSnapshot)
            gpus = [replace(g, pids=[], owners=[], util_pct=0.0, idle=True, mem_used_mib=0.0) for g in e.data.gpus]
            core.step(e.model_copy(update={"data": replace(e.data, gpus=gpus, processes=[])}),
                      T0 + timedelta(seconds=30))
        big_engine.hold.changed()
    raw = await bus.request(S.ENGINE_FREE, b"{}", timeout=60)
    reply = orjson.loads(raw)
    assert reply["ok"] and len(raw) < bus.max_payload
    answer = reply["answer"]
    assert answer["free_gpus"] == FLEET * GPUS
    assert 0 < len(answer["nodes"]) < FLEET and len(answer["nodes"]) + answer["more_nodes"] == FLEET
