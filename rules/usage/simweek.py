"""A realistic past of usage for simulated nodes (`gpuevents simulate --history 7d`), so a newcomer's first report
and heatmap have something to show. Pure: snapshots are generated, then counted by the same aggregator as live.

Each GPU runs a sequence of jobs with gaps between them, by people of three teams: training runs (busy, now and
then a stall), notebooks left open (held idle, the longer when started late in the day), scheduler jobs that
were allocated and never used, and small inference servers that use a sliver of a GPU (they would fit a MIG
slice: right-sizing has something to advise). More jobs start in working hours than at night or at the weekend.
The teams waste less as the weeks go by — `nlp` most of all, so a quarter's KPI has a story to tell — and the
last week less than the one before, so week over week has one too.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from gpuevents.events import GpuInfo, JobInfo, NodeInfo, NodeSnapshot, ProcessInfo, SnapshotEvent, make_event
from rules.usage.fits import FitAggregator
from rules.usage.jobledger import JobKey, JobLedger, JobTally
from rules.usage.rollup import HOUR, UsageAggregator, UsageBatch

TEAMS = {"vision": ("alice", "dave", "grace"), "nlp": ("bob", "erin", "heidi"), "speech": ("carol", "frank")}
TEAM_OF = {user: team for team, users in TEAMS.items() for user in users}  # for GPUs a job holds with no process
MODEL = "NVIDIA H100 80GB HBM3"
MEM_TOTAL_MIB = 81559.0
WEEK_S = 7 * 86400


@dataclass(frozen=True, slots=True)
class Segment:
    """What one GPU did from `start` to `end` (epoch seconds)."""

    start: float
    end: float
    kind: str  # training | stall | notebook | allocated
    user: str
    team: str
    job: str | None
    pid: int
    util: float
    mem_mib: float


@dataclass(frozen=True)
class HistoryPlan:
    nodes: tuple[str, ...]
    gpus_per_node: int
    start: datetime
    end: datetime
    cluster: str = "default"
    step_s: float = 300.0
    seed: int = 1
    timezone: str = "UTC"


def _rng(seed: int, node: str, gpu: int) -> random.Random:
    return random.Random(zlib.crc32(f"{seed}/{node}/{gpu}".encode()))


def _gap_s(rng: random.Random, local: datetime) -> float:
    """How long a GPU stays free: minutes in working hours, hours at night, most of a day at the weekend."""
    if local.weekday() >= 5:
        return rng.expovariate(1 / (10 * 3600))
    if 9 <= local.hour < 19:
        return rng.expovariate(1 / (40 * 60))
    return rng.expovariate(1 / (4 * 3600))


def gpu_timeline(plan: HistoryPlan, node: str, gpu: int) -> list[Segment]:
    """The jobs one GPU ran over the plan's span; free time is what lies between them."""
    rng = _rng(plan.seed, node, gpu)
    tz = ZoneInfo(plan.timezone)
    t, end = plan.start.timestamp(), plan.end.timestamp()
    last_week = end - WEEK_S
    out: list[Segment] = []
    next_id = 700000 + rng.randrange(100000)
    while t < end:
        t += _gap_s(rng, datetime.fromtimestamp(t, tz))
        if t >= end:
            break
        local = datetime.fromtimestamp(t, tz)
        team = rng.choice(sorted(TEAMS))
        user = rng.choice(TEAMS[team])
        careful = t >= last_week  # the teams got better lately: fewer notebooks left open, fewer unused jobs
        # and over the whole span: nlp, who wasted most at first, learns most (a quarter's KPI improves)
        progress = (t - plan.start.timestamp()) / max(end - plan.start.timestamp(), 1.0)
        sloppy = (1.6 - 1.3 * progress) if team == "nlp" else (1.0 - 0.3 * progress)
        weights = [0.6, 0.25 * sloppy, 0.1 * sloppy, 0.08] if careful else [0.6, 0.45 * sloppy, 0.22 * sloppy, 0.08]
        kind = rng.choices(["training", "notebook", "allocated", "inference"], weights=weights)[0]
        next_id += rng.randrange(1, 40)
        job = str(next_id) if kind == "allocated" or rng.random() < 0.6 else None
        pid = rng.randrange(2000, 60000)
        if kind == "training":
            length = rng.uniform(1, 16) * 3600
            util = min(99.0, max(40.0, rng.gauss(85, 8)))
            mem = rng.uniform(0.5, 0.95) * MEM_TOTAL_MIB
            if rng.random() < 0.25 and length > 3 * 3600:  # a stall: the data loader hangs, the GPU waits
                stall_at = t + rng.uniform(0.3, 0.7) * length
                stall = rng.uniform(0.5, 2) * 3600
                out.append(Segment(t, stall_at, kind, user, team, job, pid, util, mem))
                out.append(Segment(stall_at, stall_at + stall, "stall", user, team, job, pid, 0.0, mem))
                out.append(Segment(stall_at + stall, t + length + stall, kind, user, team, job, pid, util, mem))
                t += length + stall
                continue
        elif kind == "notebook":
            # opened in the afternoon, left open until the next morning
            overnight = local.hour >= 16 and (not careful or rng.random() < 0.4)
            length = (rng.uniform(14, 20) if overnight else rng.uniform(1, 5)) * 3600
            util, mem = rng.uniform(0, 2), rng.uniform(0.1, 0.35) * MEM_TOTAL_MIB
        elif kind == "inference":  # a small model served all day: a few % of the SMs, a few GB
            length = rng.uniform(8, 30) * 3600
            util, mem = rng.uniform(6, 20), rng.uniform(1_000, 9_000)
        else:
            length, util, mem = rng.uniform(1, 6) * 3600, 0.0, 0.0
        out.append(Segment(t, t + length, kind, user, team, job, pid, util, mem))
        t += length
    return out


def _gpu_at(node: str, index: int, seg: Segment | None, t: float, rng: random.Random) -> GpuInfo:
    if seg is None:
        return GpuInfo(node=node, index=index, uuid=f"GPU-sim-{node}-{index}", model=MODEL, util_pct=0.0,
                       mem_used_mib=0.0, mem_total_mib=MEM_TOTAL_MIB, power_w=70.0, idle=True)
    util = seg.util if seg.util < 5 else min(100.0, max(0.0, seg.util + rng.uniform(-6, 6)))
    busy = util >= 5
    return GpuInfo(
        node=node, index=index, uuid=f"GPU-sim-{node}-{index}", model=MODEL, util_pct=round(util, 1),
        mem_used_mib=round(seg.mem_mib), mem_total_mib=MEM_TOTAL_MIB, power_w=120 + 5.2 * util if busy else 75.0,
        idle=not busy, pids=[] if seg.kind == "allocated" else [seg.pid],
        allocated=True if seg.job else None, job=seg.job, owner=seg.user if seg.kind == "allocated" else None,
    )


def _process(node: str, index: int, seg: Segment) -> ProcessInfo:
    name = {"notebook": "jupyter-lab", "inference": "tritonserver"}.get(seg.kind, "python")
    cmd = {"notebook": "jupyter-lab --no-browser", "inference": "tritonserver --model-repository=/models"}.get(
        seg.kind, "python train.py")
    return ProcessInfo(node=node, pid=seg.pid, name=name, cmdline=cmd, user=seg.user,
                       create_time=datetime.fromtimestamp(seg.start, UTC), gpus=[index],
                       gpu_mem_mib=round(seg.mem_mib), labels={"team": seg.team}, job=seg.job)


SERVICE = JobInfo(id="chat/Deployment/chat-api", scheduler="kubernetes", user="carol", namespace="chat",
                  controller="Deployment/chat-api")


def _service(node: str, index: int, t: float, tz: ZoneInfo, rng: random.Random) -> tuple[GpuInfo, ProcessInfo]:
    """A chat service on Kubernetes that is busy in office hours on weekdays and idle the rest of the time, its pod
    holding the GPU all along (right-sizing proposes scaling it down on a schedule)."""
    local = datetime.fromtimestamp(t, tz)
    busy = local.weekday() < 5 and 8 <= local.hour < 20
    util = round(rng.uniform(35, 70), 1) if busy else 0.0
    gpu = GpuInfo(node=node, index=index, uuid=f"GPU-sim-{node}-{index}", model=MODEL, util_pct=util,
                  mem_used_mib=30_000.0, mem_total_mib=MEM_TOTAL_MIB, power_w=120 + 5.2 * util if busy else 80.0,
                  idle=not busy, pids=[4242], allocated=True, job=SERVICE.id)
    proc = ProcessInfo(node=node, pid=4242, name="python", cmdline="python serve.py", user="carol",
                       create_time=datetime.fromtimestamp(t - 86400, UTC), gpus=[index], gpu_mem_mib=30_000.0,
                       labels={"team": "speech"}, pod="chat/chat-api-7d9f8-x2x1", job=SERVICE.id)
    return gpu, proc


def history_events(plan: HistoryPlan) -> Iterator[SnapshotEvent]:
    """Every node's snapshot at every step of the plan, in time order. With two GPUs or more, the first node's last
    GPU runs an office-hours service (see `_service`) instead of jobs."""
    tz = ZoneInfo(plan.timezone)
    service = (plan.nodes[0], plan.gpus_per_node - 1) if plan.gpus_per_node >= 2 else None
    timelines = {(n, g): gpu_timeline(plan, n, g) for n in plan.nodes for g in range(plan.gpus_per_node)}
    cursor = dict.fromkeys(timelines, 0)
    noise = random.Random(plan.seed)
    t, end = plan.start.timestamp(), plan.end.timestamp()
    while t < end:
        at = datetime.fromtimestamp(t, UTC)
        for node in plan.nodes:
            gpus, procs, jobs = [], [], []
            for g in range(plan.gpus_per_node):
                if (node, g) == service:
                    gpu, proc = _service(node, g, t, tz, noise)
                    gpus.append(gpu)
                    procs.append(proc)
                    jobs.append(SERVICE.model_copy(update={"gpus": [g], "pids": [proc.pid]}))
                    continue
                segs = timelines[(node, g)]
                i = cursor[(node, g)]
                while i < len(segs) and segs[i].end <= t:
                    i += 1
                cursor[(node, g)] = i
                seg = segs[i] if i < len(segs) and segs[i].start <= t else None
                gpus.append(_gpu_at(node, g, seg, t, noise))
                if seg is not None and seg.kind != "allocated":
                    procs.append(_process(node, g, seg))
                if seg is not None and seg.job is not None:  # what the node's scheduler says it runs
                    jobs.append(JobInfo(id=seg.job, user=seg.user, partition="gpu", gpus=[g],
                                        pids=[] if seg.kind == "allocated" else [seg.pid]))
            snap = NodeSnapshot(node=NodeInfo(name=node, cluster=plan.cluster, gpu_count=plan.gpus_per_node,
                                              labels={"pool": "simulated"}), gpus=gpus, processes=procs,
                                jobs=jobs)
            yield make_event("node.snapshot", node, snap, cluster=plan.cluster, time=at)
        t += plan.step_s


def history_span(now: datetime, seconds: float) -> tuple[datetime, datetime]:
    """The span a history of `seconds` covers: up to the start of the current hour (the engine counts this one)."""
    end = int(now.timestamp()) // HOUR * HOUR
    return datetime.fromtimestamp(end - seconds, UTC), datetime.fromtimestamp(end, UTC)


def count_history(plan: HistoryPlan, aggregator: UsageAggregator, fits: FitAggregator | None = None,
                  jobs: dict[JobKey, JobTally] | None = None) -> UsageBatch:
    """The plan's snapshots counted into hourly buckets, as the engine counts live ones (and, with `fits`, what
    each workload used, for right-sizing; with `jobs`, each scheduler job's summary tally, every job ended by the
    end of the plan)."""
    ledger = JobLedger(max_gap_s=3 * plan.step_s)
    next_drain = plan.start.timestamp() + HOUR
    for event in history_events(plan):
        aggregator.observe(event, event.time)
        if fits is not None:
            fits.observe(event, event.time)
        if jobs is not None:
            ledger.observe(event)
            if event.time.timestamp() >= next_drain:  # ended jobs are let go as the engine lets them go
                jobs.update((t.key, t) for t in ledger.drain(event.time))
                next_drain += HOUR
    if jobs is not None:
        jobs.update((t.key, t) for t in ledger.drain(plan.end + timedelta(seconds=3 * plan.step_s + 1)))
    aggregator.settle(plan.end)
    return aggregator.drain()


def drop_recorded(batch: UsageBatch, recorded: set[tuple[int, str, str]]) -> UsageBatch:
    """The batch without the (hour, cluster, node) buckets already recorded: simulated history never adds to real
    usage, and writing it twice adds nothing."""
    return UsageBatch(
        usage=[(k, a) for k, a in batch.usage if (k.hour, k.cluster, k.node) not in recorded],
        idle_jobs=[(k, a) for k, a in batch.idle_jobs if (k.hour, k.cluster, k.node) not in recorded],
    )
