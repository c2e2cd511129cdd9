"""Per-job tallies from snapshots (GPU-seconds, utilisation, SM activity, memory, idle time, energy; their spread
as small histograms for the 95th percentiles) and the moment each job ends: pure, time from the events, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpuevents.agentdata import GpuInfo, JobInfo
from gpuevents.events import SnapshotEvent
from rules.lang.exemptions import parse as parse_exemptions
from rules.usage.fits import bin_of, mem_bin_of

JobKey = tuple[str, str, str]
"""(cluster, scheduler, job id)"""


@dataclass
class JobTally:
    """What one job has used so far; `ended_at` once it has ended."""

    cluster: str
    scheduler: str
    id: str
    first_seen: datetime
    last_seen: datetime
    user: str | None = None
    name: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    namespace: str | None = None
    model: str | None = None
    nodes: list[str] = field(default_factory=list)
    gpu_count: int = 0
    started_at: datetime | None = None
    ended_at: datetime | None = None
    gpu_s: float = 0.0
    util_s: float = 0.0
    util_known_s: float = 0.0
    util_peak: float | None = None
    sm_s: float = 0.0
    sm_known_s: float = 0.0
    mem_peak_mib: float | None = None
    idle_gpu_s: float = 0.0
    kwh: float = 0.0
    util_hist: dict[int, float] = field(default_factory=dict)  # 5 % bin -> GPU-seconds (rules/usage/fits.py)
    sm_hist: dict[int, float] = field(default_factory=dict)
    mem_hist: dict[int, float] = field(default_factory=dict)  # memory bin (fits.mem_bin_of) -> GPU-seconds
    gpus_on: dict[str, int] = field(default_factory=dict)  # node -> how many of its GPUs the job holds
    samples: dict[str, list[GpuInfo]] = field(default_factory=dict)  # node -> its job's GPUs, last sampled
    on_nodes: dict[str, datetime] = field(default_factory=dict)
    """Node -> its latest snapshot that listed this job (the job is on no node once it has ended)."""
    simulated: bool = False  # written by `gpuevents simulate --history`, not seen on a fleet
    imported: bool = False  # written by `gpuevents import` from the site's history, not seen live
    exemption: str | None = None  # the annotations exempting it (`gpuevents.io/keep-until: …`), or None
    exempt_until: datetime | None = None

    @property
    def key(self) -> JobKey:
        return (self.cluster, self.scheduler, self.id)

    def describe(self, j: JobInfo, at: datetime) -> None:
        for name in ("user", "name", "account", "partition", "qos", "namespace", "started_at"):
            value = getattr(j, name)
            if value is not None:
                setattr(self, name, value)
        if j.annotations:  # the exemption its annotations grant (DESIGN's keep-until / exclude), as last seen
            granted, malformed = parse_exemptions(j.annotations, at)
            said = [e.source for e in granted] + [f"malformed {m}" for m in malformed]
            self.exemption = "; ".join(said) or None
            ends = [e.until for e in granted]
            self.exempt_until = max(ends) if ends else None


def _peak(old: float | None, new: float | None) -> float | None:
    if new is None:
        return old
    return new if old is None or new > old else old


class JobLedger:
    """Tallies of the jobs that snapshots list, integrated over each node's snapshot intervals.

    A job ends at the first snapshot of its last node that no longer lists it (the epilog removed its mapping,
    the pod went), or, when its nodes go silent, `max_gap_s` after it was last seen."""

    def __init__(self, max_gap_s: float) -> None:
        self.max_gap = timedelta(seconds=max_gap_s)
        self.jobs: dict[JobKey, JobTally] = {}
        self.of_node: dict[tuple[str, str], set[JobKey]] = {}  # (cluster, node) -> jobs its last snapshot listed
        self.dirty: set[JobKey] = set()

    def resume(self, tallies: list[JobTally]) -> None:
        """Running jobs' tallies as stored before a restart: they go on adding up."""
        for t in tallies:
            if t.ended_at is None:
                self.jobs[t.key] = t

    def observe(self, event: SnapshotEvent) -> None:
        snap, t, cluster, node = event.data, event.time, event.cluster, event.node
        gpus = {g.index: g for g in snap.gpus}
        now_here: set[JobKey] = set()
        for j in snap.jobs:
            key: JobKey = (cluster, j.scheduler, j.id)
            now_here.add(key)
            tally = self.jobs.get(key)
            if tally is None:
                tally = self.jobs[key] = JobTally(cluster, j.scheduler, j.id, first_seen=t, last_seen=t)
            tally.describe(j, t)
            self._credit(tally, node, t)
            held = [gpus[i] for i in j.gpus if i in gpus]
            tally.on_nodes[node] = t
            tally.samples[node] = held
            tally.last_seen = max(tally.last_seen, t)
            if node not in tally.nodes:
                tally.nodes.append(node)
            tally.gpus_on[node] = len(held)
            tally.gpu_count = max(tally.gpu_count, sum(tally.gpus_on.values()))
            for g in held:
                tally.model = tally.model or g.model
                tally.util_peak = _peak(tally.util_peak, g.util_pct)
                tally.mem_peak_mib = _peak(tally.mem_peak_mib, g.mem_used_mib)
            self.dirty.add(key)
        before = self.of_node.get((cluster, node), set())
        for key in before - now_here:
            self._leave(key, node, t)
        if now_here:
            self.of_node[(cluster, node)] = now_here
        else:
            self.of_node.pop((cluster, node), None)

    def _credit(self, tally: JobTally, node: str, t: datetime) -> None:
        """The node's last sample of the job holds from its time until `t` (a snapshot is the node's state until
        the next one), at most `max_gap`: a silence is not counted as use."""
        prev = tally.on_nodes.get(node)
        if prev is None:
            return
        dt = max(0.0, min((t - prev).total_seconds(), self.max_gap.total_seconds()))
        for g in tally.samples.get(node, []):
            tally.gpu_s += dt
            if dt <= 0:
                continue
            if g.util_pct is not None:
                tally.util_s += g.util_pct * dt
                tally.util_known_s += dt
                b = bin_of(g.util_pct)
                tally.util_hist[b] = tally.util_hist.get(b, 0.0) + dt
            if g.sm_active_pct is not None:
                tally.sm_s += g.sm_active_pct * dt
                tally.sm_known_s += dt
                b = bin_of(g.sm_active_pct)
                tally.sm_hist[b] = tally.sm_hist.get(b, 0.0) + dt
            if g.mem_used_mib is not None:
                b = mem_bin_of(g.mem_used_mib)
                tally.mem_hist[b] = tally.mem_hist.get(b, 0.0) + dt
            if g.idle:
                tally.idle_gpu_s += dt
            if g.power_w is not None:
                tally.kwh += g.power_w * dt / 3.6e6

    def _leave(self, key: JobKey, node: str, t: datetime) -> None:
        tally = self.jobs.get(key)
        if tally is None:
            return
        self._credit(tally, node, t)
        tally.on_nodes.pop(node, None)
        tally.samples.pop(node, None)
        tally.gpus_on.pop(node, None)
        if not tally.on_nodes:
            tally.ended_at = t
        self.dirty.add(key)

    def drain(self, now: datetime) -> list[JobTally]:
        """The tallies changed since the last drain, jobs whose nodes fell silent ended; ended ones are let go."""
        for key, tally in self.jobs.items():
            if tally.ended_at is None and now - tally.last_seen > self.max_gap:
                tally.ended_at = tally.last_seen
                tally.on_nodes.clear()
                tally.samples.clear()
                self.dirty.add(key)
        out = [self.jobs[k] for k in sorted(self.dirty) if k in self.jobs]
        self.dirty.clear()
        for t in out:
            if t.ended_at is not None:
                del self.jobs[t.key]
        for jobs in self.of_node.values():
            jobs.intersection_update(self.jobs)
        return out
