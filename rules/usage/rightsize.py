"""Right-sizing: the smallest fit of a workload — a MIG slice, a smaller GPU model of the fleet, or a shared GPU —
from what it used, and what that would save per week. Pure.

A fit must hold the workload's peak GPU memory plus headroom, and enough compute for its busiest (p95) use plus
headroom: on a MIG slice, its share of the SMs; on another model, scaled by the two models' dense FP16 throughput;
shared (time-sliced), its share of the time. A slice or a smaller model, which isolate the workload, come before
sharing, which does not. Too little observation time gives no advice, said plainly. A workload already on a MIG
slice is measured against that slice (its utilization is the slice's), costs the slice's share of its GPU, and is
offered only a smaller slice of the same GPU.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from gpuevents.costs import CostModel
from gpuevents.mig import MigProfile, instance_profile, profiles_of
from rules.usage.fits import FitAmounts, FitKey, percentile
from rules.usage.weekly import RightsizeLine

HOURS_PER_WEEK = 168.0
HEADROOM = 0.2  # 20 % over the measured peak memory and p95 compute
MIN_HOURS = 1.0  # observed GPU-hours below which nothing is advised

# Dense FP16/BF16 tensor TFLOPS (NVIDIA datasheets, without sparsity): a rough exchange rate of compute between
# models. Patterns are matched in order against the lower-cased model name.
THROUGHPUT_TFLOPS: tuple[tuple[str, float], ...] = (
    ("gb200|b200", 2250.0),
    ("gh200|h200|h100.*sxm|h100 80gb hbm3", 989.0),
    ("h100.*(nvl|94)", 835.0),
    ("h100", 756.0),  # PCIe
    ("a100", 312.0),
    ("l40s", 362.0),
    ("l40", 181.0),
    ("a40", 150.0),
    ("a30", 165.0),
    ("a10\\b|a10g", 125.0),
    ("l4\\b", 121.0),
    ("v100", 125.0),
    ("t4", 65.0),
)

FitKind = Literal["mig", "smaller_gpu", "share", "whole", "unknown"]


@dataclass(frozen=True, slots=True)
class WorkloadUse:
    """What a job or workload used over a window, per GPU it held."""

    key: str  # job/slurm/123, job/kubernetes/ns/Deployment/x, or a user
    owner: str | None
    team: str | None
    model: str | None  # the GPU model it ran on
    gpus: int  # GPUs held at once
    held_hours: float  # GPU-hours held in the window
    peak_mem_mib: float | None
    p95_util_pct: float | None  # utilization (or SM activity where measured) at its 95th percentile
    sm_active_pct: float | None = None  # p95 SM activity where GPM measures it (a better compute measure)
    mem_total_mib: float | None = None


@dataclass(frozen=True, slots=True)
class Fit:
    """The advice for one workload."""

    key: str
    owner: str | None
    team: str | None
    kind: FitKind
    target: str  # "MIG 2g.20gb", "NVIDIA L4", "1/4 of a GPU (time-sliced)", "" for whole/unknown
    share: float  # of the current GPU's cost the fit costs (1.0: no saving)
    saving_per_week: float
    reason: str

    @property
    def advised(self) -> bool:
        return self.kind in ("mig", "smaller_gpu", "share")


def throughput(model: str | None) -> float | None:
    if not model:
        return None
    name = model.lower()
    return next((t for pattern, t in THROUGHPUT_TFLOPS if re.search(pattern, name)), None)


def _compute_need(use: WorkloadUse) -> float | None:
    """The share of one GPU's compute it needs at its busiest, headroom included (0-1+), or None unmeasured."""
    measured = use.sm_active_pct if use.sm_active_pct is not None else use.p95_util_pct
    if measured is None:
        return None
    return max(measured, 0.0) / 100.0 * (1.0 + HEADROOM)


def _mem_need(use: WorkloadUse) -> float | None:
    return None if use.peak_mem_mib is None else max(use.peak_mem_mib, 0.0) * (1.0 + HEADROOM)


def mig_fit(profiles: Sequence[MigProfile], mem_need_mib: float, compute_need: float) -> MigProfile | None:
    """The cheapest profile (fewest compute slices, then least memory) that holds both needs, short of the whole
    GPU; None when only the whole GPU does."""
    fits = [p for p in profiles
            if p.compute_slices < p.total_slices and p.memory_mib >= mem_need_mib and p.compute_share >= compute_need]
    return min(fits, key=lambda p: (p.compute_share, p.memory_fraction), default=None)


def advise(use: WorkloadUse, fleet_models: Iterable[tuple[str, float]], costs: CostModel,
           window_hours: float = HOURS_PER_WEEK) -> Fit:
    """The smallest fit for `use` among its model's MIG profiles, the smaller models present in the fleet
    (`(model, mem_total_mib)` pairs) and sharing, with what it saves per week at the rate it was held over a
    window of `window_hours`."""
    def fit(kind: FitKind, target: str, share: float, reason: str) -> Fit:
        weekly = costs.hourly(use.model) * use.held_hours * HOURS_PER_WEEK / max(window_hours, 1.0)
        return Fit(use.key, use.owner, use.team, kind, target, share,
                   max(0.0, (1.0 - share) * weekly), reason)

    mem_need = _mem_need(use)
    compute_need = _compute_need(use)
    if use.held_hours < MIN_HOURS or mem_need is None or compute_need is None:
        return Fit(use.key, use.owner, use.team, "unknown", "", 1.0, 0.0,
                   f"too little data: {use.held_hours:.1f} GPU-hours observed"
                   + ("" if mem_need is not None else ", no memory reading")
                   + ("" if compute_need is not None else ", no utilization reading"))
    current = instance_profile(use.model)
    if current is not None:
        return _advise_on_slice(use, current, mem_need, compute_need, costs, window_hours)
    if compute_need >= 1.0:
        return fit("whole", "", 1.0, f"uses {compute_need / (1 + HEADROOM):.0%} of its GPU's compute at p95")
    busiest = f"{compute_need / (1 + HEADROOM):.0%}"
    peak = f"{use.peak_mem_mib or 0:,.0f} MiB"
    candidates: list[Fit] = []
    profile = mig_fit(profiles_of(use.model), mem_need, compute_need)
    if profile is not None:
        candidates.append(fit("mig", f"MIG {profile.name}", profile.compute_share,
                              f"peak {peak} and p95 compute {busiest} fit a "
                              f"{profile.name} slice ({profile.compute_slices}/{profile.total_slices} of the GPU)"))
    own_tp = throughput(use.model)
    own_cost = costs.hourly(use.model)
    for model, mem_total in sorted(set(fleet_models)):
        tp = throughput(model)
        other_cost = costs.hourly(model)
        if tp is None or own_tp is None or own_cost <= 0 or other_cost >= own_cost or model == use.model:
            continue
        if mem_total * 0.95 >= mem_need and compute_need * own_tp / tp <= 1.0:
            candidates.append(fit("smaller_gpu", model, other_cost / own_cost,
                                  f"peak {peak} and p95 compute {busiest} fit a {model}"))
    if candidates:  # a slice or a model of its own isolates it: preferred to sharing, the cheapest first
        return min(candidates, key=lambda f: (f.share, f.kind != "mig"))
    own_mem = use.mem_total_mib
    if own_mem and compute_need <= 0.5:
        ways = int(min(8.0, 1.0 / max(compute_need, 1e-9), own_mem / max(mem_need, 1.0)))
        if ways >= 2:
            candidates.append(fit("share", f"1/{ways} of a GPU (time-sliced)", 1.0 / ways,
                                  f"p95 compute {busiest} and peak {peak} "
                                  f"let {ways} such workloads share one GPU"))
    if not candidates:
        return fit("whole", "", 1.0, "no smaller slice, model or share holds its peak memory and compute")
    return candidates[0]


def _advise_on_slice(use: WorkloadUse, current: MigProfile, mem_need: float, compute_need: float, costs: CostModel,
                     window_hours: float) -> Fit:
    """A workload on a MIG slice: a smaller slice of the same GPU that holds its needs, its compute need (a share of
    the slice) taken to a share of the whole GPU; the saving counted on the slice's cost (its share of the GPU)."""
    parent = re.split(r"(?i)\bmig\s", use.model or "")[0]  # `NVIDIA A100-SXM4-40GB MIG 3g.20gb` → the GPU
    on_gpu = compute_need * current.compute_share
    weekly = (costs.hourly(use.model) * current.compute_share * use.held_hours * HOURS_PER_WEEK
              / max(window_hours, 1.0))
    smaller = [p for p in profiles_of(parent) if p.total_slices == current.total_slices
               and p.compute_slices < current.compute_slices]
    profile = mig_fit(smaller, mem_need, on_gpu)
    busiest = f"{compute_need / (1 + HEADROOM):.0%}"
    if profile is None:
        return Fit(use.key, use.owner, use.team, "whole", "", 1.0, 0.0,
                   f"no slice smaller than its {current.name} holds its peak {use.peak_mem_mib or 0:,.0f} MiB and "
                   f"p95 compute {busiest} of the slice")
    share = profile.compute_share / current.compute_share
    return Fit(use.key, use.owner, use.team, "mig", f"MIG {profile.name}", share, max(0.0, (1.0 - share) * weekly),
               f"peak {use.peak_mem_mib or 0:,.0f} MiB and p95 compute {busiest} of its {current.name} slice fit a "
               f"{profile.name} slice ({profile.compute_slices}/{profile.total_slices} of the GPU, "
               f"{profile.compute_slices} of its {current.compute_slices} slices)")


def rank(fits: Iterable[Fit]) -> list[Fit]:
    """Advice first, biggest saving first; then the rest by key."""
    items = list(fits)
    return sorted(items, key=lambda f: (not f.advised, -f.saving_per_week, f.key))


@dataclass(frozen=True, slots=True)
class OwnerFits:
    """One user's workloads over a window: how many, how many would fit smaller, what that saves."""

    owner: str
    team: str | None
    workloads: int
    advised: int
    too_little_data: int
    saving_per_week: float
    biggest: Fit | None  # the advice that saves most


def per_owner(fits: Iterable[Fit]) -> list[OwnerFits]:
    """The advice added up per owner, the biggest saving first (right-sizing for a user, not a job)."""
    mine: dict[str, list[Fit]] = {}
    for f in fits:
        mine.setdefault(f.owner or "unknown", []).append(f)
    out = []
    for owner, items in mine.items():
        advised = [f for f in items if f.advised]
        out.append(OwnerFits(owner=owner, team=next((f.team for f in items if f.team), None), workloads=len(items),
                             advised=len(advised), too_little_data=sum(1 for f in items if f.kind == "unknown"),
                             saving_per_week=sum(f.saving_per_week for f in advised),
                             biggest=max(advised, key=lambda f: f.saving_per_week, default=None)))
    return sorted(out, key=lambda o: (-o.saving_per_week, o.owner))


def uses_from_fits(items: Iterable[tuple[FitKey, FitAmounts]], team: str | None = None) -> list[WorkloadUse]:
    """Each workload's use over the window the hourly fit rows cover (p95 from the summed histograms). Two sites'
    workloads of one name (Slurm job 123 at both) stay two: with several clusters, each key names its own
    (`<cluster>:job/slurm/123`)."""
    merged: dict[tuple[str, str], FitAmounts] = {}
    for key, amounts in items:
        if team is not None and amounts.team != team:
            continue
        mine = merged.get((key.cluster, key.workload))
        if mine is None:
            merged[key.cluster, key.workload] = FitAmounts(**{f: getattr(amounts, f) for f in FitAmounts.__slots__})
        else:
            mine.merge(amounts)
    several = len({cluster for cluster, _w in merged}) > 1
    return [
        WorkloadUse(key=f"{cluster}:{workload}" if several else workload, owner=a.owner or None, team=a.team or None,
                    model=a.model or None, gpus=a.gpus,
                    held_hours=a.held_s / 3600.0, peak_mem_mib=a.peak_mem_mib if a.mem_total_mib or a.peak_mem_mib
                    else None, p95_util_pct=percentile(a.util_hist, 0.95), sm_active_pct=percentile(a.sm_hist, 0.95),
                    mem_total_mib=a.mem_total_mib or None)
        for (cluster, workload), a in merged.items()
    ]


def rightsize_lines(items: Iterable[tuple[FitKey, FitAmounts]], costs: CostModel, window_hours: float,
                    team: str | None = None, limit: int = 10) -> list[RightsizeLine]:
    """The report's section: the workloads that would fit smaller over the window, biggest saving first."""
    rows = list(items)
    models = {(a.model, a.mem_total_mib) for _k, a in rows if a.model and a.mem_total_mib}
    uses = {u.key: u for u in uses_from_fits(rows, team)}
    window_hours = observed_hours(rows, window_hours)
    fits = rank(advise(u, models, costs, window_hours) for u in uses.values())
    return [RightsizeLine(workload=f.key, owner=f.owner, team=f.team, gpus=uses[f.key].gpus, model=uses[f.key].model,
                          fits=f.target, saving_per_week=f.saving_per_week, reason=f.reason)
            for f in fits if f.advised][:limit]


def observed_hours(items: Iterable[tuple[FitKey, FitAmounts]], window_hours: float) -> float:
    """The hours of the window that usage was recorded in (a store younger than the window asked for must not
    spread its savings over time it never saw)."""
    hours = [k.hour for k, _a in items]
    if not hours:
        return window_hours
    return max(1.0, min(window_hours, (max(hours) - min(hours)) / 3600 + 1))
