"""A shared GPU's hours split by use: each owner's part follows NVML's per-process SM share of the GPU
(`gpu_util_pct`); equal parts where that is unknown or nobody used the GPU."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, SnapshotEvent, make_event
from rules.usage.rollup import UsageAggregator

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def snap(at: datetime, alice: float | None, bob: float | None, idle: bool = False) -> SnapshotEvent:
    procs = [ProcessInfo(node="n1", pid=1, user="alice", create_time=T0, gpus=[0], gpu_util_pct=alice),
             ProcessInfo(node="n1", pid=2, user="bob", create_time=T0, gpus=[0], gpu_util_pct=bob)]
    gpu = GpuInfo(node="n1", index=0, model="H100", util_pct=0 if idle else 80, idle=idle,
                  idle_since=T0 if idle else None, pids=[1, 2], owners=["alice", "bob"], power_w=300.0)
    data = NodeSnapshot(node=NodeInfo(name="n1", cluster="c"), gpus=[gpu], processes=procs)
    return make_event("node.snapshot", "n1", data, cluster="c", time=at)


def split(alice: float | None, bob: float | None, idle: bool = False) -> dict[str, tuple[float, float]]:
    agg = UsageAggregator(snapshot_interval=60.0)
    for m in range(60):
        at = T0 + timedelta(minutes=m)
        agg.observe(snap(at, alice, bob, idle), at)
    agg.settle(T0 + timedelta(hours=1))
    return {k.owner: (round(a.busy_s + a.held_s), round(a.busy_kwh + a.held_kwh, 4)) for k, a in agg.drain().usage}


def test_a_shared_gpu_s_hour_is_split_by_each_owner_s_use() -> None:
    assert split(60.0, 20.0) == {"alice": (2700, 0.225), "bob": (900, 0.075)}


def test_equal_parts_where_use_is_unknown_or_nobody_used_it() -> None:
    assert split(None, 20.0) == {"alice": (1800, 0.15), "bob": (1800, 0.15)}
    assert split(0.0, 0.0, idle=True) == {"alice": (1800, 0.15), "bob": (1800, 0.15)}
