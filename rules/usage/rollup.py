"""Pure usage aggregation: node snapshots → hourly GPU-seconds (busy, held idle, free, held
but unknown: no activity signal) and energy."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import NamedTuple

from gpuevents.agentdata import GpuInfo, NodeSnapshot, ProcessInfo
from gpuevents.costs import physical_shares
from gpuevents.events import SnapshotEvent
from gpuevents.holding import held_idle

HOUR = 3600
NO_TEAM = ""
UNALLOCATED = ""
JOB_PREFIX = "job:"  # an idle job's key when the scheduler job is known: `job:<id>`


# Plain tuples and slotted dataclasses here, not pydantic: these are built per GPU per snapshot on
# the engine's hot path and never leave the process (the report models are pydantic).
class UsageKey(NamedTuple):
    """One hourly bucket of one GPU for one owner (`""`: nobody) in one team (`""`: none)."""

    hour: int  # epoch seconds of the bucket start, UTC
    cluster: str
    node: str
    gpu: int
    owner: str
    team: str


@dataclass(slots=True)
class UsageAmounts:
    """GPU-seconds by state, utilization-seconds and energy; added up across intervals."""

    model: str = ""
    busy_s: float = 0.0
    held_s: float = 0.0
    free_s: float = 0.0
    util_s: float = 0.0  # Σ util_pct × seconds, over the seconds where util was known
    util_known_s: float = 0.0
    busy_kwh: float = 0.0
    held_kwh: float = 0.0
    free_kwh: float = 0.0
    unknown_s: float = 0.0  # held, with nothing that measures its activity: neither busy nor idle
    unknown_kwh: float = 0.0
    cap_saved_kwh: float = 0.0  # energy a power cap saved (the draw before it less the draw under it)


_USAGE_SUMS = tuple(f.name for f in fields(UsageAmounts) if f.name != "model")
_STATES = {"busy": 0, "held": 1, "free": 2, "unknown": 3}


class IdleJobKey(NamedTuple):
    """One process (or pod) holding an idle GPU, in one hourly bucket."""

    hour: int
    cluster: str
    node: str
    gpu: int
    job: str  # stable: `job:<scheduler job id>`, else `pod:<ns/name>`, else `pid:<pid>@<create time>`


@dataclass(slots=True)
class IdleJobAmounts:
    name: str = ""  # what people recognise: the pod, else the process name and pid
    owner: str = ""
    team: str = ""
    model: str = ""
    held_s: float = 0.0
    held_kwh: float = 0.0


@dataclass
class UsageBatch:
    """What one drain of the aggregator hands to the store."""

    usage: list[tuple[UsageKey, UsageAmounts]] = field(default_factory=list)
    idle_jobs: list[tuple[IdleJobKey, IdleJobAmounts]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.usage or self.idle_jobs)


@dataclass
class TeamResolver:
    """Who a process belongs to (owner) and which team: label on the process, on the node, then the map."""

    team_label: str = "team"
    owners: Mapping[str, str] = field(default_factory=dict)  # user -> owner (config `owners`)
    teams: Mapping[str, str] = field(default_factory=dict)  # owner or user -> team

    def owner_of(self, process: ProcessInfo) -> str:
        if process.owner:
            return process.owner
        if process.user:
            return self.owners.get(process.user, process.user)
        return "unknown"

    def team_of(self, owner: str, process: ProcessInfo | None, node_labels: Mapping[str, str]) -> str:
        if process is not None and process.labels.get(self.team_label):
            return process.labels[self.team_label]
        if node_labels.get(self.team_label):
            return node_labels[self.team_label]
        if owner in self.teams:
            return self.teams[owner]
        if process is not None and process.user and process.user in self.teams:
            return self.teams[process.user]
        return NO_TEAM


@dataclass(slots=True)
class _NodeMark:
    """The last snapshot of a node, and how far its state has been counted."""

    snapshot: NodeSnapshot
    at: float
    counted_until: float
    sig: tuple[object, ...] | None = None  # what the plan's keys depend on (see `_signature`), worked out once
    plan: list[_GpuPlan] | None = None  # what the snapshot adds per second, worked out once per `sig`
    rates: list[tuple[float, float | None, float]] | None = None  # per plan GPU: kWh/s, util, kWh saved/s
    bound: _Bound | None = None  # the plan's buckets of one hour, looked up once


@dataclass(slots=True)
class _Bound:
    """A plan tied to the buckets of one hour (valid until the aggregator is drained): per share of a GPU, the
    amounts to add to, its state (0 busy, 1 held, 2 free), its part of the GPU and the GPU's place in the plan (its
    rates come from the node's latest reading); per idle job, its amounts, part and GPU's place."""

    generation: int
    hour: int
    cluster: str
    usage: list[tuple[UsageAmounts, int, float, int]]
    jobs: list[tuple[IdleJobAmounts, float, int]]


@dataclass
class _GpuPlan:
    """One GPU of a snapshot: its state, power, utilisation, and who shares its time."""

    index: int
    pos: int  # its place in the snapshot's `gpus`
    model: str
    state: str  # busy | held | free | unknown
    watts: float
    rated_w: float  # what it draws when it reports no power
    util_pct: float | None
    shares: list[tuple[str, str]]
    jobs: list[tuple[str, str, ProcessInfo | None, str]]  # (job, name, a process, its owner without one)
    physical: float = 1.0  # its share of a physical GPU (a MIG instance: 1/n; see physical_shares)
    saved_w: float = 0.0  # what a power cap on it saves now
    weights: list[float] | None = None  # each share's part of its time, by use (None: equal parts)


def _by_use(shares: list[tuple[str, str]], holders: list[ProcessInfo], teams: TeamResolver) -> list[float] | None:
    """A shared GPU's time split by what each owner's processes used of it (NVML's per-process SM share,
    `gpu_util_pct`); None (equal parts) with one owner, or where a holder's use is unknown or nobody used it."""
    if len(shares) < 2 or not holders or any(p.gpu_util_pct is None for p in holders):
        return None
    used: dict[str, float] = {}
    for p in holders:
        owner = teams.owner_of(p)
        used[owner] = used.get(owner, 0.0) + max(0.0, p.gpu_util_pct or 0.0)
    total = sum(used.get(owner, 0.0) for owner, _ in shares)
    if total <= 0 or any(owner not in used for owner, _ in shares):  # an owner named otherwise: equal parts
        return None
    return [used.get(owner, 0.0) / total for owner, _ in shares]


_last_signed: list[tuple[NodeSnapshot, tuple[object, ...]]] = []


def signature(snap: NodeSnapshot) -> tuple[object, ...]:
    """What a snapshot's plans (the rollups' and the fits' keys, states, parts and idle jobs) depend on, and nothing
    that changes with every reading (utilisation, memory, power, temperature): equal signatures, equal plans.
    The last one is remembered (with its snapshot, so its id is not reused): the fits ask for it next."""
    if _last_signed and _last_signed[0][0] is snap:
        return _last_signed[0][1]
    sig = _signature(snap)
    _last_signed[:] = [(snap, sig)]
    return sig


def _signature(snap: NodeSnapshot) -> tuple[object, ...]:
    return (
        snap.node.name, snap.node.labels,
        tuple((g.index, g.uuid, g.mig_parent, g.model, g.lost, g.idle, g.activity_known, tuple(g.pids),
               tuple(g.owners), g.owner, g.allocated, g.job) for g in snap.gpus),
        tuple((p.pid, p.owner, p.user, p.labels, p.job, p.pod, p.name, p.create_time, p.gpu_util_pct is None)
              for p in snap.processes),
        tuple((j.id, j.scheduler, j.owner, j.user, j.name) for j in snap.jobs),
    )


def _rates_of(gpu: GpuInfo, plan: _GpuPlan) -> tuple[float, float | None, float]:
    """kWh per second, utilisation and kWh saved per second of one GPU's reading."""
    watts = gpu.power_w if gpu.power_w is not None else plan.rated_w
    return max(watts, 0.0) / 3_600_000, gpu.util_pct, max(0.0, gpu.power_cap_saved_w or 0.0) / 3_600_000


def _job_of(process: ProcessInfo) -> tuple[str, str]:
    if process.job:
        return f"{JOB_PREFIX}{process.job}", process.pod or f"{process.name or 'job'} (job {process.job})"
    if process.pod:
        return f"pod:{process.pod}", process.pod
    key = f"pid:{process.pid}@{process.create_time.timestamp():.0f}"
    return key, f"{process.name or 'process'} (pid {process.pid})"


class UsageAggregator:
    """Adds up what each node's snapshots say, time-weighted, into hourly buckets held in memory.

    A snapshot describes its node from its own time until the node's next snapshot, but for at
    most `max_gap` seconds: an outage is not counted as hours of anything. Time comes from the
    events (so a replay gives the same totals); `now` only guards against clocks in the future.
    """

    def __init__(
        self,
        *,
        snapshot_interval: float = 15.0,
        gap_intervals: float = 3.0,
        teams: TeamResolver | None = None,
        rated_power_w: Callable[[str | None], float] | None = None,
    ) -> None:
        self.max_gap = snapshot_interval * gap_intervals
        self.teams = teams or TeamResolver()
        self.rated_power_w = rated_power_w or (lambda _model: 0.0)
        self._nodes: dict[tuple[str, str], _NodeMark] = {}
        self._usage: dict[UsageKey, UsageAmounts] = {}
        self._jobs: dict[IdleJobKey, IdleJobAmounts] = {}
        self._generation = 0  # a drain starts new buckets: bound plans look theirs up again

    def observe(self, event: SnapshotEvent, now: datetime) -> None:
        """Count the node's previous state up to this snapshot, then remember this one.

        Per snapshot this only counts the time since the last one; the plan (keys, owners, teams) is worked out
        again only when what it depends on changed (`_signature`), not when only the readings did."""
        at = min(event.time.timestamp(), now.timestamp())
        snap = event.data
        key = (event.cluster, snap.node.name or event.node)
        mark = self._nodes.get(key)
        if mark is not None:
            if at <= mark.at:
                return  # a redelivered or out-of-order snapshot: already counted
            self._count(key[0], mark, min(at, mark.at + self.max_gap))
            if mark.snapshot is snap:
                # the engine hands a repeated snapshot over as the object it holds: plan and buckets stay
                mark.at = mark.counted_until = at
                return
            sig = signature(snap)
            if mark.plan is not None and sig == mark.sig:
                rates = self._rates(snap, mark.plan)
                if rates is not None:  # same keys, new readings: the plan and its bound buckets stay
                    mark.snapshot, mark.at, mark.counted_until, mark.rates = snap, at, at, rates
                    return
            self._nodes[key] = _NodeMark(snapshot=snap, at=at, counted_until=at, sig=sig)
            return
        self._nodes[key] = _NodeMark(snapshot=snap, at=at, counted_until=at, sig=signature(snap))

    def settle(self, now: datetime) -> None:
        """Count every node's current state up to `now` (capped), so a flush misses nothing."""
        t = now.timestamp()
        for (cluster, _node), mark in self._nodes.items():
            self._count(cluster, mark, min(t, mark.at + self.max_gap))

    def forget(self, cluster: str, node: str) -> None:
        self._nodes.pop((cluster, node), None)

    def drain(self) -> UsageBatch:
        """Hand over what was added up since the last drain, and start again from zero."""
        batch = UsageBatch(usage=list(self._usage.items()), idle_jobs=list(self._jobs.items()))
        self._usage = {}
        self._jobs = {}
        self._generation += 1
        return batch

    def restore(self, batch: UsageBatch) -> None:
        """Add a drained batch back (its write failed), so the next drain hands it over again."""
        for key, amounts in batch.usage:
            a = self._usage.get(key)
            if a is None:
                self._usage[key] = amounts
                continue
            a.model = a.model or amounts.model
            for name in _USAGE_SUMS:
                setattr(a, name, getattr(a, name) + getattr(amounts, name))
        for job_key, job in batch.idle_jobs:
            j = self._jobs.get(job_key)
            if j is None:
                self._jobs[job_key] = job
            else:
                j.held_s += job.held_s
                j.held_kwh += job.held_kwh

    # ------------------------------------------------------------ counting
    def _count(self, cluster: str, mark: _NodeMark, until: float) -> None:
        start = mark.counted_until
        if until <= start:
            return
        mark.counted_until = until
        if mark.plan is None or mark.rates is None:
            mark.plan = self._plan(mark.snapshot)
            mark.rates = [_rates_of(mark.snapshot.gpus[g.pos], g) for g in mark.plan]
        t = start
        while t < until:
            hour = int(t // HOUR) * HOUR
            end = min(until, hour + HOUR)
            bound = mark.bound
            if bound is None or bound.generation != self._generation or bound.hour != hour or (
                bound.cluster != cluster
            ):
                bound = mark.bound = self._bind(cluster, mark.snapshot.node.name, mark.plan,
                                                mark.snapshot.node.labels, hour)
            self._add_interval(bound, mark.rates, end - t)
            t = end

    def _plan(self, snap: NodeSnapshot) -> list[_GpuPlan]:
        """Per GPU, what does not depend on the interval: state, power, owners and teams, idle jobs."""
        procs = {p.pid: p for p in snap.processes}
        job_infos = {j.id: j for j in snap.jobs}
        physical = physical_shares(snap.gpus)
        plan = []
        for pos, gpu in enumerate(snap.gpus):
            if gpu.lost or not physical[gpu.index]:
                continue  # a MIG parent is counted through its instances
            holders = [procs[pid] for pid in gpu.pids if pid in procs]
            if held_idle(gpu):
                state = "held"
            elif gpu.idle:
                state = "free"
            else:  # held with no activity signal is unknown: never counted as used
                state = "busy" if gpu.activity_known else "unknown"
            watts = gpu.power_w if gpu.power_w is not None else self.rated_power_w(gpu.model)
            info = job_infos.get(gpu.job) if gpu.job else None
            job_owner = (info.owner or (self.teams.owners.get(info.user, info.user) if info.user else None)
                         if info is not None else None)
            shares = self._shares(gpu, holders, snap.node.labels, job_owner) if state != "free" else [
                (UNALLOCATED, self.teams.team_of(UNALLOCATED, None, snap.node.labels))
            ]
            jobs: dict[str, tuple[str, ProcessInfo | None, str]] = {}
            if state == "held":
                for p in holders:
                    job, name = _job_of(p)
                    jobs.setdefault(job, (name, p, ""))
                if not jobs and gpu.job:  # allocated, nothing running: the job holds it
                    owner = gpu.owner or (gpu.owners[0] if gpu.owners else None) or job_owner or "unknown"
                    name = f"{info.name} (job {gpu.job})" if info is not None and info.name else f"job {gpu.job}"
                    jobs[f"{JOB_PREFIX}{gpu.job}"] = (name, None, owner)
            plan.append(_GpuPlan(index=gpu.index, pos=pos, model=gpu.model or "", state=state, watts=watts,
                                 rated_w=self.rated_power_w(gpu.model),
                                 util_pct=gpu.util_pct, shares=shares, weights=_by_use(shares, holders, self.teams),
                                 jobs=[(job, name, p, o) for job, (name, p, o) in jobs.items()],
                                 physical=physical[gpu.index], saved_w=max(0.0, gpu.power_cap_saved_w or 0.0)))
        return plan

    def _bind(self, cluster: str, node: str, plan: list[_GpuPlan], node_labels: Mapping[str, str],
              hour: int) -> _Bound:
        """Look up (or create) the buckets `plan` adds to in `hour`."""
        usage: list[tuple[UsageAmounts, int, float, int]] = []
        jobs: list[tuple[IdleJobAmounts, float, int]] = []
        for n_gpu, gpu in enumerate(plan):
            state = _STATES[gpu.state]
            for n, (owner, team) in enumerate(gpu.shares):
                part = gpu.physical * (gpu.weights[n] if gpu.weights else 1.0 / len(gpu.shares))
                key = UsageKey(hour, cluster, node, gpu.index, owner, team)
                a = self._usage.get(key)
                if a is None:
                    a = self._usage[key] = UsageAmounts(model=gpu.model)
                usage.append((a, state, part, n_gpu))
            if gpu.jobs:
                job_part = gpu.physical / len(gpu.jobs)
                for job, name, p, fallback_owner in gpu.jobs:
                    job_key = IdleJobKey(hour, cluster, node, gpu.index, job)
                    j = self._jobs.get(job_key)
                    if j is None:
                        owner = self.teams.owner_of(p) if p is not None else fallback_owner
                        j = self._jobs[job_key] = IdleJobAmounts(
                            name=name, owner=owner, team=self.teams.team_of(owner, p, node_labels),
                            model=gpu.model,
                        )
                    jobs.append((j, job_part, n_gpu))
        return _Bound(generation=self._generation, hour=hour, cluster=cluster, usage=usage, jobs=jobs)

    @staticmethod
    def _add_interval(bound: _Bound, rates: list[tuple[float, float | None, float]], seconds: float) -> None:
        for a, state, part, n_gpu in bound.usage:
            kwh_per_s, util_pct, saved_per_s = rates[n_gpu]
            s = seconds * part
            kwh = kwh_per_s * part * seconds
            a.cap_saved_kwh += saved_per_s * part * seconds
            if state == 0:
                a.busy_s += s
                a.busy_kwh += kwh
            elif state == 1:
                a.held_s += s
                a.held_kwh += kwh
            elif state == 2:
                a.free_s += s
                a.free_kwh += kwh
            else:
                a.unknown_s += s
                a.unknown_kwh += kwh
            if util_pct is not None:
                a.util_s += util_pct * s
                a.util_known_s += s
        for j, part, n_gpu in bound.jobs:
            j.held_s += seconds * part
            j.held_kwh += rates[n_gpu][0] * part * seconds

    def _rates(self, snap: NodeSnapshot, plan: list[_GpuPlan]) -> list[tuple[float, float | None, float]] | None:
        """What the plan's GPUs add per second by the readings of `snap`, whose signature is the plan's; None when
        a shared GPU's split by use changed (the plan is worked out again)."""
        procs: dict[int, ProcessInfo] | None = None
        out = []
        for g in plan:
            gpu = snap.gpus[g.pos]
            if len(g.shares) > 1:  # split by use: follows the processes' readings
                procs = procs if procs is not None else {p.pid: p for p in snap.processes}
                holders = [procs[pid] for pid in gpu.pids if pid in procs]
                if _by_use(g.shares, holders, self.teams) != g.weights:
                    return None
            out.append(_rates_of(gpu, g))
        return out

    def _shares(
        self, gpu: GpuInfo, holders: list[ProcessInfo], node_labels: Mapping[str, str], job_owner: str | None = None
    ) -> list[tuple[str, str]]:
        """(owner, team) pairs sharing this GPU's time equally: the agent's owners, else the processes', else the
        owner of the job it is allocated to."""
        by_owner: dict[str, ProcessInfo] = {}
        for p in holders:
            by_owner.setdefault(self.teams.owner_of(p), p)
        owners = (list(gpu.owners) or ([gpu.owner] if gpu.owner else []) or list(by_owner)
                  or ([job_owner] if job_owner else []) or ["unknown"])
        return [(o, self.teams.team_of(o, by_owner.get(o), node_labels)) for o in dict.fromkeys(owners)]
