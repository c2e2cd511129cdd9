"""Held idle means one thing everywhere: the /metrics gauge, status (the read model), the dashboard, the usage
report and the rules (`gpu.held_idle`) count the same GPUs, on a fleet with every case."""

from __future__ import annotations

from pathlib import Path

from gpuevents.config import Config
from gpuevents.costs import CostModel
from gpuevents.events import SnapshotEvent
from gpuevents.wire.fleet import FleetNode
from rules.core.core import Core
from rules.core.inputs import Tick
from rules.engine.metrics import EngineMetrics
from rules.engine.read.readmodel import build_read_model
from rules.engine.read.slices import Slicer
from rules.usage.rollup import UsageAggregator
from rules.usage.store import UsageStore
from rules.usage.weekly import build_report
from tests.rules.helpers import at, gpu, proc, rules_from, snapshot

COSTS = CostModel(Config().costs)
EVERY_S = 60
END = 2 * 3600
HELD_RULE = """\
rules:
  - name: held
    entity: gpu
    when: gpu.held_idle
    actions: [{type: log, message: "{{ entity.id }}"}]
"""
HELD = {"p/gpu0", "a/gpu0", "o/gpu0", "m/gpu1"}
"""What must be counted: a process on an idle GPU; a scheduler's allocation with nothing running; an owner
named with no process; a MIG instance with a process (not its parent, which shows the same process)."""


def fleet(t: float) -> list[SnapshotEvent]:
    """Every case at `t`; node `off` falls silent 500 s before the end: offline by then, not yet forgotten."""
    snaps = [
        snapshot(at(t), "p", gpus=[gpu(0, pids=[1]), gpu(1, 90, pids=[2]), gpu(2, pids=[3], lost=True)],
                 processes=[proc(1, gpus=[0]), proc(2, gpus=[1]), proc(3, gpus=[2])]),
        snapshot(at(t), "a", gpus=[gpu(0, allocated=True, job="7"), gpu(1, allocated=False)]),
        snapshot(at(t), "o", gpus=[gpu(0, owners=["bob"], owner="bob"), gpu(1)]),
        snapshot(at(t), "m", gpus=[gpu(0, uuid="GPU-P", pids=[5]),
                                   gpu(1, uuid="MIG-1", mig_parent="GPU-P", model="A100 MIG 7g.80gb", pids=[5])],
                 processes=[proc(5, gpus=[0, 1])]),
    ]
    if t <= END - 500:
        snaps.append(snapshot(at(t), "off", gpus=[gpu(0, pids=[9])], processes=[proc(9, gpus=[0])]))
    return snaps


async def test_gauge_status_report_and_rules_count_the_same_held_idle_gpus(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, HELD_RULE), Config())
    usage = UsageAggregator(snapshot_interval=EVERY_S)
    for t in range(0, END + 1, EVERY_S):
        if t == END:
            usage.settle(at(t - EVERY_S))
            usage.drain()  # the report below covers the last minute: the fleet as it is now
        for e in fleet(t):
            core.step(e, e.time)
            usage.observe(e, e.time)
    now = at(END)
    core.step(Tick(), now)
    assert not core.state.nodes["off"].online

    metrics = EngineMetrics()
    metrics.observe_fleet(core)
    gauge = metrics.registry.get_sample_value("gpuevents_held_idle_gpus")

    model = await build_read_model(core, now, 1, COSTS, Slicer(0.0))
    nodes = [FleetNode.model_validate_json(raw) for raw in model.node_json]
    status = {f"{n.name}/gpu{g.index}" for n in nodes for g in n.gpus if g.held_idle}

    usage.settle(now)
    with UsageStore(tmp_path / "usage.sqlite") as store:
        store.add(usage.drain())
        since = at(END - 3600)
        rows = store.usage(since.timestamp(), now.timestamp(), None)
    report = build_report(rows, [], COSTS, since=since, until=now, generated_at=now)
    reported = {f"{r.node}/gpu{r.gpu}" for r in rows if r.held_s > 0}

    # the rules see the GPUs of the nodes online (an offline node's entities are not evaluated)
    online = {e.key for e in core.state.by_kind["gpu"].values() if core.state.online(e)}
    views = {g.id for g in core.gpus() if g.held_idle and g.id in online}
    firing = {i.entity_key for i in core.open_incidents() if i.status == "firing" and i.entity_key in online}

    assert status == reported == views == firing == HELD
    assert gauge == model.summary.held_idle == len(HELD)
    assert round(report.fleet.held_idle_h * 3600 / EVERY_S, 6) == len(HELD)  # each one the whole minute


def test_a_mig_parent_stops_counting_when_its_instances_appear(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, HELD_RULE), Config())
    whole = [gpu(0, uuid="GPU-P", pids=[5])]
    core.step(snapshot(at(0), "m", gpus=whole, processes=[proc(5, gpus=[0])]), at(0))
    assert {i.entity_key for i in core.open_incidents()} == {"m/gpu0"}
    parted = [*whole, gpu(1, uuid="MIG-1", mig_parent="GPU-P", pids=[5])]
    core.step(snapshot(at(EVERY_S), "m", gpus=parted, processes=[proc(5, gpus=[0, 1])]), at(EVERY_S))
    assert {i.entity_key for i in core.open_incidents()} == {"m/gpu1"}

