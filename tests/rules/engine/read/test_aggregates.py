"""The status summary kept as aggregates: over random changes of a fleet, the summary answered from the kept
counts is byte for byte the one a read model built from scratch gives."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuevents.config import Config
from gpuevents.costs import CostModel
from gpuevents.wire.status import TOP
from rules.core.core import Core, ForgetNode, Tick
from rules.engine.read import readings
from rules.engine.read.aggregates import FleetAggregates
from rules.engine.read.readmodel import ReadModel, build_read_model
from rules.engine.read.slices import Slicer
from rules.engine.read.status import summary_of
from tests.rules.helpers import at, gpu, idle_core, proc, snapshot

COSTS = CostModel(Config().costs)
NODES = ("a", "b", "c", "d", "e")
MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", None)

# one GPU: (util, held by a process, allocated, model)
gpus_ = st.lists(st.tuples(st.sampled_from([0.0, 2.0, 60.0, 95.0]), st.booleans(), st.booleans(),
                           st.sampled_from(MODELS)), min_size=0, max_size=4)
change = st.one_of(
    st.tuples(st.just("snapshot"), st.sampled_from(NODES), st.sampled_from(["default", "x"]), gpus_, st.booleans()),
    st.tuples(st.just("tick"), st.integers(1, 4000)),  # time passes: incidents fire, nodes go offline
    st.tuples(st.just("forget"), st.sampled_from(NODES)),
    st.tuples(st.just("same"), st.sampled_from(NODES)),  # the node's last snapshot again
)


def step(core: Core, c: tuple, t: float, last: dict[str, tuple]) -> float:  # type: ignore[type-arg]
    kind = c[0]
    if kind == "tick":
        t += c[1]
        core.step(Tick(), at(t))
    elif kind == "forget":
        cluster = last.pop(c[1], ("snapshot", c[1], "default", [], False))[2]
        core.step(ForgetNode(node=c[1], cluster=cluster), at(t))
    else:
        if kind == "same":
            if c[1] not in last:
                return t
            c = last[c[1]]
        _, node, cluster, spec, mig = c
        last[node] = c
        t += 1
        gs = [gpu(i, util, node=node, pids=[100 + i] if held else [], allocated=alloc, power_w=300.0,
                  idle_since=at(t - 600) if util < 5 else None, **{"model": model, **mig_fields(i, mig)})
              for i, (util, held, alloc, model) in enumerate(spec)]
        procs = [proc(100 + i, node=node, gpus=[i]) for i, (_u, held, _a, _m) in enumerate(spec) if held]
        core.step(snapshot(at(t), node, gpus=gs, processes=procs, cluster=cluster), at(t))
    return t


def mig_fields(index: int, mig: bool) -> dict[str, str | None]:
    """With `mig`, GPU 0 is a MIG parent and the others its 3g.20gb instances (each costed as 3/7 of it)."""
    if not mig:
        return {}
    if index == 0:
        return {"uuid": "GPU-parent"}
    return {"mig_parent": "GPU-parent", "uuid": f"MIG-{index}", "model": "NVIDIA A100-SXM4-40GB MIG 3g.20gb"}


def summaries(model: ReadModel) -> list[bytes]:
    return [summary_of(model, top).model_dump_json().encode() for top in (1, 2, TOP)]


@settings(max_examples=60, deadline=None)
@given(st.lists(change, min_size=1, max_size=25))
def test_the_kept_summary_is_the_one_built_from_scratch(changes: list[tuple]) -> None:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as tmp:
        core = idle_core(Path(tmp))
    kept = FleetAggregates()
    last: dict[str, tuple] = {}  # type: ignore[type-arg]
    t = 0.0

    async def compare(version: int) -> None:
        now = at(t + 30)
        fresh = await build_read_model(core, now, version, COSTS, Slicer(0.0))
        answered = await kept.summary(core, now, version, COSTS, Slicer(0.0))  # a pause at every check
        assert summaries(answered) == summaries(fresh)
        assert answered.clusters == fresh.clusters and answered.summary_only

    for version, c in enumerate(changes):
        t = step(core, c, t, last)
        asyncio.run(compare(version))


async def test_only_the_nodes_that_changed_are_counted_again(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    for n in NODES:
        core.step(snapshot(at(0), n, gpus=[gpu(0, node=n, pids=[1])], processes=[proc(1, node=n)]), at(0))
    kept = FleetAggregates()
    await kept.summary(core, at(10), 0, COSTS)
    before = {k: kept.counts(core, k, COSTS) for k in readings.node_keys(core)}
    core.step(snapshot(at(20), "c", gpus=[gpu(0, 90, node="c")]), at(20))
    model = await kept.summary(core, at(30), 1, COSTS)
    after = {k: kept.counts(core, k, COSTS) for k in readings.node_keys(core)}
    recounted = [before[k].name for k in before if after[k] is not before[k]]  # type: ignore[union-attr]
    assert recounted == ["c"]
    assert (model.summary.busy, model.summary.held_idle) == (1, 4)
