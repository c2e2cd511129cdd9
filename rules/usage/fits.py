"""What each workload used, for right-sizing: per hour and workload (a scheduler job, else a pod, else an owner),
the GPU-time it held, its peak GPU memory and how its utilization (and SM activity) was spread. Pure.

Utilization is kept as a histogram of seconds in twenty 5 % bins, so the 95th percentile of any window is read from
the sum of its hours without keeping samples. A job's summary keeps GPU memory the same way, in bins an eighth of
an octave wide (each 9 % above the last), so its p95 memory is bounded in size and never under the truth.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from gpuevents.agentdata import GpuInfo, JobInfo, NodeSnapshot, ProcessInfo
from gpuevents.events import SnapshotEvent
from gpuevents.holding import held
from rules.usage.rollup import HOUR, TeamResolver, signature

BINS = 20


class FitKey(NamedTuple):
    hour: int
    cluster: str
    workload: str  # `job/<scheduler>/<id>`, `pod/<ns>/<name>` or `owner/<owner>`


@dataclass(slots=True)
class FitAmounts:
    owner: str = ""
    team: str = ""
    model: str = ""
    node: str = ""  # a node it ran on (the first seen)
    gpus: int = 0  # most GPUs held at once
    held_s: float = 0.0  # GPU-seconds held
    peak_mem_mib: float = 0.0
    mem_total_mib: float = 0.0
    util_hist: list[float] = field(default_factory=lambda: [0.0] * BINS)  # seconds per 5 % bin
    sm_hist: list[float] = field(default_factory=lambda: [0.0] * BINS)

    def merge(self, other: FitAmounts) -> None:
        self.owner = self.owner or other.owner
        self.team = self.team or other.team
        self.model = self.model or other.model
        self.node = self.node or other.node
        self.gpus = max(self.gpus, other.gpus)
        self.held_s += other.held_s
        self.peak_mem_mib = max(self.peak_mem_mib, other.peak_mem_mib)
        self.mem_total_mib = max(self.mem_total_mib, other.mem_total_mib)
        self.util_hist = [a + b for a, b in zip(self.util_hist, other.util_hist, strict=True)]
        self.sm_hist = [a + b for a, b in zip(self.sm_hist, other.sm_hist, strict=True)]


def bin_of(pct: float) -> int:
    return min(BINS - 1, max(0, int(pct // (100 / BINS))))


def percentile(hist: Iterable[float], q: float) -> float | None:
    """The `q` quantile (0-1) of a dense 5 % histogram, as the upper edge of its bin (never under the truth)."""
    return sparse_percentile(dict(enumerate(hist)), q, pct_edge)


MEM_BASE_MIB = 64.0  # bin 0 holds readings under 64 MiB
MEM_STEP = 2 ** (1 / 8)  # each bin's upper edge 9 % above the one before
MEM_BINS = 113  # the last bin's upper edge is 64 MiB x 2^14 = 1 TiB; readings above it fall into it


def mem_bin_of(mib: float) -> int:
    """The memory bin of a reading: 0 under 64 MiB, then bins 2^(1/8) wide (the last one open-ended)."""
    return min(bisect_right(_MEM_EDGES, mib), MEM_BINS - 1)


def mem_edge(i: int) -> float:
    """The upper edge (MiB, exclusive) of memory bin `i`."""
    return _MEM_EDGES[i]


_MEM_EDGES = tuple(MEM_BASE_MIB * MEM_STEP**i for i in range(MEM_BINS))  # upper edge of each bin


def sparse_percentile(hist: Mapping[int, float], q: float, edge: Callable[[int], float],
                      cap: float | None = None) -> float | None:
    """The `q` quantile (0-1) of a sparse histogram, as the upper edge of its bin (never under the truth), at most
    `cap` (the measured peak: no quantile exceeds it); None when empty."""
    total = sum(v for v in hist.values() if v > 0)
    if total <= 0:
        return None
    running = 0.0
    found = edge(max(hist))
    for b in sorted(hist):
        running += max(hist[b], 0.0)
        if running >= q * total - 1e-9:
            found = edge(b)
            break
    return found if cap is None else min(found, cap)


def pct_edge(i: int) -> float:
    """The upper edge of a 5 % bin."""
    return (i + 1) * (100 / BINS)


def workload_of(gpu: GpuInfo, procs: list[ProcessInfo], owner: str, info: JobInfo | None = None) -> str:
    """The entity id of the job holding the GPU (DESIGN §3.1), else its pod, else its owner."""
    if info is not None:
        return f"job/{info.scheduler}/{info.id}"
    job = gpu.job or next((p.job for p in procs if p.job), None)
    if job:
        return job if job.startswith("job/") else f"job/slurm/{job}"
    pod = next((p.pod for p in procs if p.pod), None)
    if pod:
        return f"pod/{pod}"
    return f"owner/{owner}"


@dataclass(slots=True)
class _Seen:
    snapshot: NodeSnapshot
    at: float
    sig: tuple[object, ...]  # what `plan` depends on (rules/usage/rollup.py `signature`)
    plan: list[tuple[int, str, str, ProcessInfo | None]] | None = None
    """Per held GPU: its place in the snapshot, its workload, owner and first holder; worked out once per `sig`."""


class FitAggregator:
    """Adds up, per hour and workload, what each node's last snapshot said, for the time until its next one (at
    most `max_gap`)."""

    def __init__(self, *, snapshot_interval: float = 15.0, gap_intervals: float = 3.0,
                 teams: TeamResolver | None = None) -> None:
        self.max_gap = snapshot_interval * gap_intervals
        self.teams = teams or TeamResolver()
        self._nodes: dict[tuple[str, str], _Seen] = {}
        self._fits: dict[FitKey, FitAmounts] = {}

    def observe(self, event: SnapshotEvent, now: datetime) -> None:
        at = min(event.time.timestamp(), now.timestamp())
        key = (event.cluster, event.data.node.name or event.node)
        seen = self._nodes.get(key)
        if seen is not None:
            if at <= seen.at:
                return
            self._count(event.cluster, seen, seen.at, min(at - seen.at, self.max_gap))
            if seen.snapshot is event.data:  # the engine's repeated snapshot: the very object
                seen.at = at
                return
            sig = signature(event.data)
            if seen.sig == sig:  # same keys, new readings: the plan stays
                seen.snapshot, seen.at = event.data, at
                return
            self._nodes[key] = _Seen(event.data, at, sig)
            return
        self._nodes[key] = _Seen(event.data, at, signature(event.data))

    def forget(self, cluster: str, node: str) -> None:
        self._nodes.pop((cluster, node), None)

    def drain(self) -> list[tuple[FitKey, FitAmounts]]:
        out = list(self._fits.items())
        self._fits = {}
        return out

    def restore(self, items: Iterable[tuple[FitKey, FitAmounts]]) -> None:
        for k, a in items:
            mine = self._fits.get(k)
            if mine is None:
                self._fits[k] = a
            else:
                mine.merge(a)

    def _plan(self, snap: NodeSnapshot) -> list[tuple[int, str, str, ProcessInfo | None]]:
        procs = {p.pid: p for p in snap.processes}
        jobs = {j.id: j for j in snap.jobs}
        plan = []
        for pos, gpu in enumerate(snap.gpus):
            if gpu.lost or not held(gpu):
                continue  # nobody holds it: nothing to size
            holders = [procs[pid] for pid in gpu.pids if pid in procs]
            info = jobs.get(gpu.job) if gpu.job else None
            owner = (self.teams.owner_of(holders[0]) if holders else
                     gpu.owner or (info.owner or info.user if info is not None else None) or "unknown")
            plan.append((pos, workload_of(gpu, holders, owner, info), owner, holders[0] if holders else None))
        return plan

    def _count(self, cluster: str, seen: _Seen, at: float, seconds: float) -> None:
        if seconds <= 0:
            return
        snap = seen.snapshot
        if seen.plan is None:
            seen.plan = self._plan(snap)
        hour = int(at // HOUR) * HOUR
        per_workload: dict[str, int] = {}
        for pos, workload, owner, holder in seen.plan:
            gpu = snap.gpus[pos]
            key = FitKey(hour, cluster, workload)
            a = self._fits.get(key)
            if a is None:
                team = self.teams.team_of(owner, holder, snap.node.labels)
                a = self._fits[key] = FitAmounts(owner=owner, team=team, model=gpu.model or "", node=snap.node.name)
            per_workload[workload] = per_workload.get(workload, 0) + 1
            a.held_s += seconds
            a.peak_mem_mib = max(a.peak_mem_mib, gpu.mem_used_mib or 0.0)
            a.mem_total_mib = max(a.mem_total_mib, gpu.mem_total_mib or 0.0)
            if gpu.util_pct is not None:
                a.util_hist[bin_of(gpu.util_pct)] += seconds
            if gpu.sm_active_pct is not None:
                a.sm_hist[bin_of(gpu.sm_active_pct)] += seconds
        for workload, n in per_workload.items():
            a = self._fits[FitKey(hour, cluster, workload)]
            a.gpus = max(a.gpus, n)
