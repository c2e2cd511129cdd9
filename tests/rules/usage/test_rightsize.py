"""Right-sizing advice: the smallest slice, model or share that holds a workload's peak memory and p95 compute,
never one that does not; too little data says so; savings by the share of the GPU the fit costs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuevents.config import CostsConfig, GpuCost
from gpuevents.costs import CostModel
from gpuevents.mig import profiles_of
from rules.usage.rightsize import HEADROOM, HOURS_PER_WEEK, WorkloadUse, advise, per_owner, rank, throughput

COSTS = CostModel(CostsConfig(models={
    "A100": GpuCost(price=15000, depreciation_years=4, rated_power_w=400),
    "H100": GpuCost(price=30000, depreciation_years=4, rated_power_w=700),
    "L4": GpuCost(price=2500, depreciation_years=4, rated_power_w=72),
}))
A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"


def _use(peak: float | None = 9_000, util: float | None = 8, model: str = A100, hours: float = 168,
         sm: float | None = None, gpus: int = 1) -> WorkloadUse:
    return WorkloadUse(key="job/slurm/7", owner="alice", team="nlp", model=model, gpus=gpus, held_hours=hours,
                       peak_mem_mib=peak, p95_util_pct=util, sm_active_pct=sm, mem_total_mib=81_559)


def test_a_bert_inference_server_fits_the_smallest_slice() -> None:
    fit = advise(_use(peak=1_100, util=6), [], COSTS)
    assert (fit.kind, fit.target) == ("mig", "MIG 1g.10gb")
    assert fit.share == pytest.approx(1 / 7)
    weekly = COSTS.hourly(A100) * HOURS_PER_WEEK
    assert fit.saving_per_week == pytest.approx(weekly * 6 / 7)


def test_a_lora_fine_tune_needing_ten_gigabytes_and_a_third_of_the_sms_gets_a_3g_slice() -> None:
    fit = advise(_use(peak=10_000, util=80, sm=33), [], COSTS)
    assert fit.target == "MIG 3g.40gb"  # 33 % + 20 % headroom needs 3 of 7 slices; sm_active wins over util


def test_a_busy_training_job_keeps_its_whole_gpu() -> None:
    fit = advise(_use(peak=70_000, util=97), [], COSTS)
    assert fit.kind == "whole" and fit.saving_per_week == 0 and not fit.advised


def test_too_little_data_is_said_plainly() -> None:
    fit = advise(_use(hours=0.5), [], COSTS)
    assert fit.kind == "unknown" and "too little data" in fit.reason
    assert advise(_use(peak=None), [], COSTS).reason.endswith("no memory reading")


def test_a_smaller_cheaper_model_of_the_fleet_is_offered_when_no_slice_exists() -> None:
    fit = advise(_use(peak=12_000, util=10, model="NVIDIA A10"), [("NVIDIA L4", 23_034.0)],
                 CostModel(CostsConfig(models={"A10": GpuCost(price=4000, rated_power_w=150),
                                               "L4": GpuCost(price=2500, rated_power_w=72)})))
    assert (fit.kind, fit.target) == ("smaller_gpu", "NVIDIA L4")
    assert 0 < fit.share < 1


def test_sharing_is_offered_where_the_model_has_no_mig() -> None:
    fit = advise(_use(peak=4_000, util=10, model="NVIDIA L40S"), [], COSTS)
    assert fit.kind == "share" and fit.target.startswith("1/")


def test_advice_is_ranked_by_saving() -> None:
    small = advise(_use(peak=1_000, util=5, hours=20), [], COSTS)
    big = advise(_use(peak=1_000, util=5, hours=300), [], COSTS)
    whole = advise(_use(peak=70_000, util=99), [], COSTS)
    assert rank([whole, small, big]) == [big, small, whole]


@given(peak=st.floats(0, 200_000), util=st.floats(0, 100), sm=st.one_of(st.none(), st.floats(0, 100)),
       model=st.sampled_from([A100, H100, "NVIDIA A100-SXM4-40GB", "NVIDIA A30", "NVIDIA H200", "NVIDIA B200",
                              "NVIDIA L4"]),
       fleet=st.lists(st.sampled_from([("NVIDIA L4", 23_034.0), ("NVIDIA A30", 24_576.0),
                                       ("NVIDIA A100-SXM4-40GB", 40_960.0)]), max_size=3))
def test_no_advice_ever_offers_less_than_the_peak_memory_plus_headroom_or_the_compute_needed(
        peak: float, util: float, sm: float | None, model: str, fleet: list[tuple[str, float]]) -> None:
    use = _use(peak=peak, util=util, sm=sm, model=model)
    fit = advise(use, fleet, COSTS)
    need_mem = peak * (1 + HEADROOM)
    need_compute = (sm if sm is not None else util) / 100 * (1 + HEADROOM)
    if fit.kind == "mig":
        profile = next(p for p in profiles_of(model) if f"MIG {p.name}" == fit.target)
        assert profile.memory_mib >= need_mem
        assert profile.compute_share >= need_compute
        assert fit.share == pytest.approx(profile.compute_share)
    elif fit.kind == "smaller_gpu":
        mem = dict(fleet)[fit.target]
        assert mem * 0.95 >= need_mem
        assert need_compute * (throughput(model) or 0) / (throughput(fit.target) or 1) <= 1.0
    elif fit.kind == "share":
        ways = round(1 / fit.share)
        assert need_mem * ways <= 81_559 and need_compute * ways <= 1.0 + 1e-9
    assert 0 <= fit.saving_per_week
    assert fit.share <= 1.0


A100_3G = "NVIDIA A100-SXM4-40GB MIG 3g.20gb"


def test_a_workload_on_a_slice_is_offered_a_smaller_slice_and_saves_on_the_slices_cost() -> None:
    # 10 % of a 3g slice is 3/7 x 12 % of the GPU with headroom: one slice holds it; 3,000 MiB + 20 % fits 1g.5gb
    fit = advise(_use(peak=3_000, util=10, model=A100_3G), [], COSTS)
    assert (fit.kind, fit.target) == ("mig", "MIG 1g.5gb")
    assert fit.share == pytest.approx(1 / 3)  # one of its three slices
    slice_weekly = COSTS.hourly(A100_3G) * 3 / 7 * HOURS_PER_WEEK
    assert fit.saving_per_week == pytest.approx(slice_weekly * 2 / 3)
    assert "of its 3g.20gb slice" in fit.reason


def test_a_busy_slice_is_never_offered_a_bigger_or_equal_one() -> None:
    fit = advise(_use(peak=3_000, util=90, model=A100_3G), [("NVIDIA L4", 23_034.0)], COSTS)
    assert fit.kind == "whole" and fit.saving_per_week == 0 and "smaller than its 3g.20gb" in fit.reason


@given(st.floats(min_value=0, max_value=100), st.floats(min_value=0, max_value=40_000),
       st.sampled_from(["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]))
def test_advice_on_a_slice_is_a_smaller_slice_of_the_same_gpu_that_holds_peak_memory_and_compute(
        util: float, peak: float, name: str) -> None:
    model = f"NVIDIA A100-SXM4-40GB MIG {name}"
    current = next(p for p in profiles_of("NVIDIA A100-SXM4-40GB") if p.name == name)
    fit = advise(_use(peak=peak, util=util, model=model), [("NVIDIA L4", 23_034.0)], COSTS)
    assert fit.kind in ("mig", "whole")
    if fit.kind == "mig":
        p = next(p for p in profiles_of("NVIDIA A100-SXM4-40GB") if f"MIG {p.name}" == fit.target)
        assert p.compute_slices < current.compute_slices
        assert p.memory_mib >= peak * (1 + HEADROOM)
        assert p.compute_share >= util / 100 * (1 + HEADROOM) * current.compute_share - 1e-9
        assert fit.share == pytest.approx(p.compute_slices / current.compute_slices)


def test_advice_adds_up_per_owner_biggest_saving_first() -> None:
    def use(key: str, owner: str, **kw: Any) -> WorkloadUse:
        return replace(_use(**kw), key=key, owner=owner)

    fits = [advise(use("job/slurm/1", "alice", peak=1_100, util=6), [], COSTS),
            advise(use("job/slurm/2", "alice", peak=70_000, util=97), [], COSTS),
            advise(use("job/slurm/3", "alice", hours=0.2), [], COSTS),
            advise(use("job/slurm/4", "bob", peak=1_100, util=6, hours=24), [], COSTS)]
    alice, bob = per_owner(fits)
    assert (alice.owner, alice.workloads, alice.advised, alice.too_little_data) == ("alice", 3, 1, 1)
    assert alice.saving_per_week == pytest.approx(fits[0].saving_per_week) and alice.biggest == fits[0]
    assert (bob.owner, bob.advised) == ("bob", 1) and 0 < bob.saving_per_week < alice.saving_per_week


def test_two_sites_jobs_of_one_id_stay_two_workloads() -> None:
    from rules.usage.fits import FitAmounts, FitKey
    from rules.usage.rightsize import uses_from_fits

    rows = [(FitKey(0, site, "job/slurm/123"), FitAmounts(owner=owner, held_s=3600.0))
            for site, owner in (("site-a", "alice"), ("site-b", "bob"))]
    uses = sorted(uses_from_fits(rows), key=lambda u: u.key)
    assert [(u.key, u.owner, u.held_hours) for u in uses] == [("site-a:job/slurm/123", "alice", 1.0),
                                                              ("site-b:job/slurm/123", "bob", 1.0)]
    [one] = uses_from_fits(rows[:1])
    assert one.key == "job/slurm/123"  # one site: as before
