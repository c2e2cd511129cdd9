"""What each workload used, per hour: GPU-time held, peak memory, the spread of utilization; percentiles from it,
and from a job's sparse histograms (memory in bins 9 % wide): never under the truth, never over the peak."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuevents.events import GpuInfo, JobInfo, NodeInfo, NodeSnapshot, ProcessInfo, SnapshotEvent, make_event
from rules.usage.fits import (
    MEM_BINS,
    MEM_STEP,
    FitAggregator,
    mem_bin_of,
    mem_edge,
    pct_edge,
    percentile,
    sparse_percentile,
)

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


def _true_quantile(samples: list[float], q: float) -> float:
    """The smallest sample with at least `q` of the samples at or under it (equal weights)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered) - 1e-9) - 1)]


@given(st.floats(min_value=0, max_value=2_000_000, allow_nan=False))
def test_a_memory_reading_falls_in_the_bin_whose_range_holds_it(mib: float) -> None:
    b = mem_bin_of(mib)
    assert 0 <= b < MEM_BINS
    if b < MEM_BINS - 1:
        assert mib < mem_edge(b)
    if b > 0:
        assert mib >= mem_edge(b - 1)


@given(st.lists(st.floats(min_value=0, max_value=200_000, allow_nan=False), min_size=1, max_size=300))
def test_p95_memory_is_never_under_the_truth_nor_over_the_peak_and_within_a_bin(samples: list[float]) -> None:
    hist: dict[int, float] = {}
    for s in samples:
        hist[mem_bin_of(s)] = hist.get(mem_bin_of(s), 0.0) + 1.0
    p95 = sparse_percentile(hist, 0.95, mem_edge, max(samples))
    truth = _true_quantile(samples, 0.95)
    assert p95 is not None
    assert truth <= p95 <= max(samples)
    assert p95 <= max(truth * MEM_STEP, mem_edge(0)) + 1e-6  # at most one bin (9 %) over, or the first bin


@given(st.lists(st.tuples(st.floats(min_value=0, max_value=100, allow_nan=False),
                          st.floats(min_value=0.5, max_value=600)), min_size=1, max_size=200))
def test_p95_utilization_weighted_by_time_is_never_under_the_truth_and_within_one_5_pct_bin(
        readings: list[tuple[float, float]]) -> None:
    hist: dict[int, float] = {}
    for pct, seconds in readings:
        b = min(19, int(pct // 5))
        hist[b] = hist.get(b, 0.0) + seconds
    peak = max(p for p, _s in readings)
    p95 = sparse_percentile(hist, 0.95, pct_edge, peak)
    total = sum(s for _p, s in readings)
    running, truth = 0.0, peak
    for pct, seconds in sorted(readings):
        running += seconds
        if running >= 0.95 * total - 1e-9:
            truth = pct
            break
    assert p95 is not None and truth <= p95 <= peak and p95 - truth <= 5 + 1e-9


def test_an_empty_histogram_has_no_percentile() -> None:
    assert sparse_percentile({}, 0.95, mem_edge) is None
