"""What each workload used, per hour: GPU-time held, peak memory, the spread of utilization; percentiles from it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuevents.events import GpuInfo, JobInfo, NodeInfo, NodeSnapshot, ProcessInfo, SnapshotEvent, make_event
from rules.usage.fits import FitAggregator, percentile

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _snap(t: float, util: float, mem: float) -> SnapshotEvent:
    gpus = [GpuInfo(node="n", index=0, model="NVIDIA A100-SXM4-80GB", util_pct=util, mem_used_mib=mem,
                    mem_total_mib=81_920, pids=[10], allocated=True, job="77"),
            GpuInfo(node="n", index=1, model="NVIDIA A100-SXM4-80GB", util_pct=0, mem_used_mib=0)]  # nobody's
    procs = [ProcessInfo(node="n", pid=10, user="alice", create_time=T0, gpus=[0], job="77")]
    snap = NodeSnapshot(node=NodeInfo(name="n"), gpus=gpus, processes=procs,
                        jobs=[JobInfo(id="77", user="alice", gpus=[0], pids=[10])])
    return make_event("node.snapshot", "n", snap, time=T0 + timedelta(seconds=t))


def test_a_jobs_hour_holds_its_gpu_time_peak_memory_and_utilization_spread() -> None:
    agg = FitAggregator(snapshot_interval=15)
    for i in range(241):  # an hour of 15 s snapshots: mostly 10 %, a burst at 62 %
        agg.observe(_snap(i * 15, 62 if i % 20 == 0 else 10, 3_000 + i), T0 + timedelta(hours=2))
    items = agg.drain()
    assert [k.workload for k, _ in items] == ["job/slurm/77"]  # the free GPU is nobody's workload
    a = items[0][1]
    assert a.held_s == pytest.approx(3600) and a.gpus == 1 and a.owner == "alice"
    assert a.peak_mem_mib == 3_239 and a.mem_total_mib == 81_920
    assert percentile(a.util_hist, 0.5) == 15  # the 10 % bin's upper edge
    assert percentile(a.util_hist, 0.99) == 65
    assert percentile([0.0] * 20, 0.95) is None


def test_an_outage_is_not_counted_as_time_held() -> None:
    agg = FitAggregator(snapshot_interval=15)
    agg.observe(_snap(0, 10, 100), T0 + timedelta(hours=9))
    agg.observe(_snap(3 * 3600, 10, 100), T0 + timedelta(hours=9))
    assert sum(a.held_s for _, a in agg.drain()) == pytest.approx(45)  # 3 intervals at most, not 3 hours
