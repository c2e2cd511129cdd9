"""A job's 95th percentiles (utilization, SM activity, GPU memory) from bounded histograms: never under the true
quantile, never over the peak, close to it; shown in the summary (JSON, text, the `job.ended` event) and used
for the slice it would have fitted, which still holds its peak memory plus headroom."""

from __future__ import annotations

import math
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from gpuevents.cli.jobs import describe
from gpuevents.config import CostsConfig
from gpuevents.costs import CostModel
from gpuevents.mig import profiles_of
from rules.core.state.jobs import SUMMARY_FIELDS
from rules.usage.fits import MEM_BINS, MEM_STEP, mem_bin_of, mem_edge, pct_edge, sparse_percentile
from rules.usage.jobledger import JobLedger
from rules.usage.jobstore import JobStore, ended_event, summary_of
from rules.usage.rightsize import HEADROOM
from tests.rules.usage.test_jobledger import T0, job, snap

COSTS = CostModel(CostsConfig())
H100 = "NVIDIA H100 80GB HBM3"


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


def _run(minutes: list[tuple[float, float, float | None]]) -> JobLedger:
    """A one-GPU job on an H100, one snapshot a minute: (utilization, memory MiB, SM activity) each minute."""
    ledger = JobLedger(max_gap_s=600)
    for m, (util, mem, sm) in enumerate(minutes):
        ledger.observe(snap("n1", T0 + timedelta(minutes=m), [util], [job([0])], mem=mem, sm=sm))
    ledger.observe(snap("n1", T0 + timedelta(minutes=len(minutes)), [0], []))
    return ledger


def test_a_job_with_a_short_spike_gets_its_p95_not_its_peak_and_a_slice_from_p95_compute() -> None:
    # two hours at 10 % and 6 GB, five minutes at 95 % and 30 GB: the peak would keep the whole GPU
    minutes = [(10.0, 6000.0, 8.0)] * 115 + [(95.0, 30000.0, 90.0)] * 5
    [t] = _run(minutes).drain(T0 + timedelta(minutes=121))
    s = summary_of(t, COSTS)
    assert s.peak_util_pct == 95 and s.p95_util_pct == 15  # the upper edge of the 10-15 % bin
    assert s.p95_sm_active_pct == 10
    assert s.peak_mem_mib == 30000 and s.p95_mem_mib is not None and 6000 <= s.p95_mem_mib <= 6000 * MEM_STEP
    # p95 SM 10 % + 20 % → 1 of 7 slices; peak 30,000 MiB + 20 % → the slice with 40 GB: 1g.20gb would not hold it
    assert s.smaller_fit == "MIG 3g.40gb"
    text = describe(s, COSTS)
    assert "util       mean 14 %   p95 15 %   peak 95 %" in text
    assert "SM active  mean 11 %   p95 10 %" in text and "memory     p95 6.2 GiB   peak 29.3 GiB" in text

    event = ended_event(s, COSTS)
    assert event.data.p95_util_pct == 15 and event.data.p95_mem_mib == s.p95_mem_mib
    assert {"p95_util_pct", "p95_sm_active_pct", "p95_mem_mib"} <= set(SUMMARY_FIELDS)


@given(st.lists(st.tuples(st.floats(min_value=0, max_value=100), st.floats(min_value=0, max_value=80_000),
                          st.none() | st.floats(min_value=0, max_value=100)), min_size=2, max_size=60))
def test_the_slice_a_job_would_have_fitted_always_holds_its_peak_memory_plus_headroom(
        minutes: list[tuple[float, float, float | None]]) -> None:
    [t] = _run(minutes).drain(T0 + timedelta(minutes=len(minutes) + 1))
    s = summary_of(t, COSTS)
    if s.smaller_fit is None:
        return
    profile = next(p for p in profiles_of(H100) if f"MIG {p.name}" == s.smaller_fit)
    assert profile.memory_mib >= max(m for _u, m, _s in minutes) * (1 + HEADROOM)
    compute = max(s.p95_sm_active_pct or 0, 0) if s.p95_sm_active_pct is not None else s.p95_util_pct or 0
    assert profile.compute_share >= compute / 100 * (1 + HEADROOM)


def test_the_histograms_survive_the_store_so_a_resumed_job_keeps_its_spread() -> None:
    minutes = [(10.0, 6000.0, None)] * 30
    ledger = JobLedger(max_gap_s=600)
    for m, (util, mem, sm) in enumerate(minutes):
        ledger.observe(snap("n1", T0 + timedelta(minutes=m), [util], [job([0])], mem=mem, sm=sm))
    [running] = ledger.drain(T0 + timedelta(minutes=30))
    with JobStore(":memory:") as store:
        store.put([running], COSTS)
        [back] = store.running()
        assert back.util_hist == running.util_hist and back.mem_hist == running.mem_hist and back.sm_hist == {}
        [s] = store.find("42")
    # a steady job: its p95 is its peak (a bin's edge is capped there)
    assert s.p95_util_pct == 10 and s.p95_sm_active_pct is None and s.p95_mem_mib == 6000


def test_simulated_summaries_never_overwrite_a_job_seen_on_the_fleet_and_are_marked() -> None:
    ledger = _run([(50.0, 9000.0, None)] * 90)
    [real] = ledger.drain(T0 + timedelta(minutes=91))
    [sim] = _run([(5.0, 100.0, None)] * 10).drain(T0 + timedelta(minutes=11))
    sim.simulated = True
    with JobStore(":memory:") as store:
        store.put([real], COSTS)
        assert store.put_new([sim], COSTS) == 0  # the same id: the fleet's job stays
        [s] = store.find("42")
        assert s.simulated is False and s.peak_util_pct == 50
        sim.id = "43"
        assert store.put_new([sim], COSTS) == 1 and store.put_new([sim], COSTS) == 0
        [s] = store.find("43")
        assert s.simulated is True
    text = describe(s, COSTS)
    assert "[SIMULATED" in text and "smaller fit not assessed: too little data" in text
