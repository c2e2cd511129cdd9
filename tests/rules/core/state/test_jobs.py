"""Jobs across nodes: one entity per job, its GPUs gathered from every node that holds a part, gone with the last."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuevents.events import GpuInfo, JobInfo, NodeInfo, NodeSnapshot, SnapshotEvent
from rules.core.state import FleetState
from rules.lang.views import EvalClock

T0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


def snap(node: str, jobs: list[JobInfo], idle: bool = True) -> SnapshotEvent:
    gpus = [GpuInfo(node=node, index=i, util_pct=0 if idle else 90, idle=idle, idle_since=T0 if idle else None)
            for i in range(2)]
    return SnapshotEvent(source=f"node/{node}", time=T0, data=NodeSnapshot(node=NodeInfo(name=node), gpus=gpus,
                                                                           jobs=jobs))


def test_a_job_on_two_nodes_is_one_entity_until_its_last_node_drops_it() -> None:
    state = FleetState(EvalClock(T0))
    part = JobInfo(id="7", user="erin", gpus=[0, 1])
    state.apply(snap("a", [part]), T0)
    change = state.apply(snap("b", [part], idle=False), T0)
    assert change is not None
    [job] = [e for e in change.changed if e.kind == "job"]
    assert job.key == "job/slurm/7" and job.view.nodes == ["a", "b"] and job.view.gpu_count == 4
    assert job.view.idle is False and job.view.util_pct == 45.0
    gpu = state.by_kind["gpu"]["a/gpu0"].view
    assert (gpu.allocated, gpu.job) == (True, "7")

    change = state.apply(snap("b", []), T0)  # b's part ended
    assert change is not None
    job = state.by_kind["job"]["job/slurm/7"]
    assert job.view.nodes == ["a"] and job.view.idle is True and job.view.idle_since == T0
    gone = state.remove_node("a").gone
    assert "job/slurm/7" in {e.key for e in gone} and "job/slurm/7" not in state.by_kind["job"]


def test_gpus_of_a_node_that_lists_jobs_are_allocated_or_not() -> None:
    state = FleetState(EvalClock(T0))
    state.apply(snap("a", [JobInfo(id="8", gpus=[1])]), T0)
    assert [(g.view.allocated, g.view.job) for g in (state.by_kind["gpu"]["a/gpu0"], state.by_kind["gpu"]["a/gpu1"])] \
        == [(False, None), (True, "8")]
    state.apply(snap("c", []), T0)
    assert state.by_kind["gpu"]["c/gpu0"].view.allocated is None  # no scheduler said anything
