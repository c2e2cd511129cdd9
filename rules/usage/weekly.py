"""The weekly usage report as data: per team and owner, fleet totals, week over week, the owners' leaderboard,
top idle jobs, a heatmap. Pure."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from pydantic import BaseModel

from gpuevents.costs import CostModel
from rules.usage.keeps import TeamKeeps
from rules.usage.rollup import HOUR, JOB_PREFIX
from rules.usage.store import IdleJobRow, UsageRow
from rules.usage.sums import UsageSum
from rules.usage.trends import LeaderLine, WeekOverWeek, leaderboard, week_over_week

WEEK = timedelta(days=7)
NO_TEAM_LABEL = "(no team)"


class OwnerLine(BaseModel):
    team: str
    owner: str
    busy_h: float
    held_idle_h: float
    util_pct: float | None
    held_idle_cost: float
    cost: float  # everything the owner's allocated GPU-hours cost


class TeamLine(BaseModel):
    team: str
    busy_h: float
    held_idle_h: float
    unallocated_h: float  # free GPUs attributed to the team (by node label)
    unknown_h: float = 0.0  # held with no activity signal (MIG without GPM or dcgm-exporter): neither
    energy_kwh: float = 0.0  # what its GPUs drew (its share of each)
    energy_cost: float = 0.0
    util_pct: float | None
    held_idle_cost: float
    unallocated_cost: float
    owners: list[OwnerLine]

    @property
    def waste_cost(self) -> float:
        return self.held_idle_cost + self.unallocated_cost


class FleetTotals(BaseModel):
    gpus: int
    gpu_h: float
    busy_h: float
    held_idle_h: float
    unallocated_h: float
    unknown_h: float = 0.0  # held with no activity signal: counted neither busy nor idle
    util_pct: float | None
    energy_kwh: float
    energy_cost: float = 0.0
    cap_saved_kwh: float = 0.0  # energy power caps saved (the draw before each cap less the draw under it)
    cap_saved_cost: float = 0.0
    cost: float
    held_idle_cost: float
    unallocated_cost: float


class IdleJobLine(BaseModel):
    name: str
    job_id: str | None = None  # the scheduler job (Slurm job id, or the pod's job), where one is known
    node: str
    cluster: str = "default"  # the node's site
    gpus: list[int]
    owner: str
    team: str
    held_idle_h: float
    cost: float


class HeatmapRow(BaseModel):
    label: str
    model: str
    cells: list[float | None]  # utilization per hour, None where nothing was counted
    held: list[bool]  # held idle for at least half of that hour


class Heatmap(BaseModel):
    hours: list[datetime]  # bucket starts, in the report's timezone
    rows: list[HeatmapRow]
    per: str  # "gpu", or "node" for large fleets
    left_out: int = 0


class KpiLine(BaseModel):
    team: str | None  # None: the fleet
    text: str  # "19 % → 58 % in 13 weeks (target 60 %)"
    on_target: bool | None


class ExemptionLine(BaseModel):
    """A job its annotations exempted from rules this week (`gpuevents.io/keep-until`, `gpuevents.io/exclude`)."""

    job: str
    user: str | None
    namespace: str | None
    exemption: str  # the annotation and its value, or why it was malformed
    until: datetime | None
    gpu_hours: float
    idle_share_pct: float | None  # of the time it held its GPUs


class RightsizeLine(BaseModel):
    workload: str
    owner: str | None
    team: str | None
    gpus: int
    model: str | None
    fits: str  # "MIG 1g.10gb", "NVIDIA L4", "1/4 of a GPU (time-sliced)"
    saving_per_week: float
    reason: str


class WeeklyReport(BaseModel):
    since: datetime
    until: datetime
    timezone: str
    team: str | None
    currency: str
    generated_at: datetime
    fleet: FleetTotals
    teams: list[TeamLine]
    top_idle_jobs: list[IdleJobLine]
    heatmap: Heatmap
    leaderboard: list[LeaderLine] = []
    week_over_week: WeekOverWeek | None = None  # None: the week before was not asked for
    simulated: bool = False  # some of the week's hours were simulated (gpuevents simulate --history)
    imported: bool = False  # some of the week's hours were imported (gpuevents import), not recorded live
    kpi: list[KpiLine] = []  # each team's utilization over the last 13 weeks against its target
    rightsize: list[RightsizeLine] = []  # workloads that would fit smaller, biggest saving first
    exemptions: list[ExemptionLine] = []  # jobs exempt by annotation this week, most idle GPU-hours first
    keeps: list[TeamKeeps] = []  # each team's keeps this week, their reasons and how idle the kept GPUs stayed



def week_ending(now: datetime) -> tuple[datetime, datetime]:
    """The seven days up to `now`: the 167 whole hours before the current one, and the current hour so far (a
    fresh install, or a demo started a minute ago, has something to show)."""
    hour = datetime.fromtimestamp(int(now.timestamp()) // HOUR * HOUR, UTC)
    return hour + timedelta(hours=1) - WEEK, now


def week_before(since: datetime) -> tuple[datetime, datetime]:
    """The seven days before a report's `since`, for week over week."""
    return since - WEEK, since


def team_label(team: str) -> str:
    return team or NO_TEAM_LABEL


def build_report(
    usage: Iterable[UsageRow],
    idle_jobs: Iterable[IdleJobRow],
    costs: CostModel,
    *,
    since: datetime,
    until: datetime,
    generated_at: datetime,
    timezone: str = "UTC",
    team: str | None = None,
    top_jobs: int = 10,
    max_heatmap_rows: int = 400,
    previous: Iterable[UsageRow] | None = None,
    leaders: int = 20,
) -> WeeklyReport:
    """Add the stored hourly buckets of [since, until) up into the report; `previous`, the buckets of the week
    before, for week over week."""
    rows = list(usage)
    fleet = UsageSum()
    teams: dict[str, UsageSum] = defaultdict(UsageSum)
    owners: dict[tuple[str, str], UsageSum] = defaultdict(UsageSum)
    gpus: set[tuple[str, str, int]] = set()
    for r in rows:
        fleet.add(r, costs)
        teams[r.team].add(r, costs)
        if r.owner:
            owners[(r.team, r.owner)].add(r, costs)
        gpus.add((r.cluster, r.node, r.gpu))

    team_lines = []
    for name, t in teams.items():
        allocated = UsageSum()
        owner_lines = []
        for (tn, owner), o in owners.items():
            if tn != name:
                continue
            allocated.util_s += o.util_s
            allocated.util_known_s += o.util_known_s
            owner_lines.append(OwnerLine(
                team=name, owner=owner, busy_h=o.busy_h, held_idle_h=o.held_h, util_pct=o.util,
                held_idle_cost=o.held_cost, cost=o.cost,
            ))
        owner_lines.sort(key=lambda o: (-o.held_idle_cost, -o.busy_h, o.owner))
        team_lines.append(TeamLine(
            team=name, busy_h=t.busy_h, held_idle_h=t.held_h, unallocated_h=t.free_h, unknown_h=t.unknown_h,
            energy_kwh=t.kwh, energy_cost=t.energy_cost,
            util_pct=allocated.util, held_idle_cost=t.held_cost, unallocated_cost=t.free_cost,
            owners=owner_lines,
        ))
    team_lines.sort(key=lambda t: (-t.waste_cost, t.team))

    return WeeklyReport(
        since=since, until=until, timezone=timezone, team=team, currency=costs.currency,
        generated_at=generated_at,
        fleet=FleetTotals(
            gpus=len(gpus), gpu_h=fleet.gpu_h, busy_h=fleet.busy_h,
            held_idle_h=fleet.held_h, unallocated_h=fleet.free_h, unknown_h=fleet.unknown_h, util_pct=fleet.util,
            energy_kwh=fleet.kwh, energy_cost=fleet.energy_cost, cap_saved_kwh=fleet.cap_saved_kwh,
            cap_saved_cost=fleet.cap_saved_cost, cost=fleet.cost, held_idle_cost=fleet.held_cost,
            unallocated_cost=fleet.free_cost,
        ),
        teams=team_lines,
        top_idle_jobs=_top_jobs(idle_jobs, costs, top_jobs),
        heatmap=_heatmap(rows, since, until, ZoneInfo(timezone), max_heatmap_rows),
        leaderboard=leaderboard(rows, costs, leaders),
        week_over_week=(week_over_week(rows, previous, costs, [t.team for t in team_lines])
                        if previous is not None else None),
    )


def _top_jobs(jobs: Iterable[IdleJobRow], costs: CostModel, limit: int) -> list[IdleJobLine]:
    acc: dict[tuple[str, str, str], IdleJobLine] = {}
    for j in jobs:
        key = (j.cluster, j.node, j.job)
        cost = costs.capital_daily(j.model or None) / 24 * j.held_s / HOUR + costs.energy_cost(j.held_kwh)
        line = acc.get(key)
        if line is None:
            acc[key] = IdleJobLine(name=j.name, job_id=job_id(j.job), node=j.node, cluster=j.cluster, gpus=[j.gpu],
                                   owner=j.owner,
                                   team=j.team, held_idle_h=j.held_s / HOUR, cost=cost)
        else:
            if j.gpu not in line.gpus:
                line.gpus.append(j.gpu)
            line.held_idle_h += j.held_s / HOUR
            line.cost += cost
    out = sorted(acc.values(), key=lambda j: (-j.cost, j.name))[:limit]
    for line in out:
        line.gpus.sort()
    return out


def job_id(key: str) -> str | None:
    """The scheduler job in an idle job's stored key (`job:<id>`), else None."""
    return key.removeprefix(JOB_PREFIX) if key.startswith(JOB_PREFIX) else None


def _heatmap(rows: list[UsageRow], since: datetime, until: datetime, tz: ZoneInfo, max_rows: int) -> Heatmap:
    first = int(since.timestamp()) // HOUR * HOUR
    n = max(0, (int(until.timestamp()) - first + HOUR - 1) // HOUR)
    gpu_keys = {(r.cluster, r.node, r.gpu) for r in rows}
    clusters = {r.cluster for r in rows}
    per = "gpu" if len(gpu_keys) <= max_rows else "node"

    def label(r: UsageRow) -> str:
        prefix = f"{r.cluster}:" if len(clusters) > 1 else ""
        return f"{prefix}{r.node}/gpu{r.gpu}" if per == "gpu" else f"{prefix}{r.node}"

    util_s: dict[str, list[float]] = {}
    known_s: dict[str, list[float]] = {}
    held_s: dict[str, list[float]] = {}
    total_s: dict[str, list[float]] = {}
    models: dict[str, str] = {}
    for r in rows:
        i = (r.hour - first) // HOUR
        if not 0 <= i < n:
            continue
        key = label(r)
        if key not in util_s:
            util_s[key], known_s[key], held_s[key], total_s[key] = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
        util_s[key][i] += r.util_s
        known_s[key][i] += r.util_known_s
        held_s[key][i] += r.held_s
        total_s[key][i] += r.busy_s + r.held_s + r.free_s + r.unknown_s
        models[key] = models.get(key) or r.model
    ordered = sorted(util_s, key=_natural)
    out_rows = [
        HeatmapRow(
            label=key,
            model=models.get(key, ""),
            cells=[u / k if k > 0 else None for u, k in zip(util_s[key], known_s[key], strict=True)],
            held=[t > 0 and h >= t / 2 for h, t in zip(held_s[key], total_s[key], strict=True)],
        )
        for key in ordered[:max_rows]
    ]
    hours = [datetime.fromtimestamp(first + i * HOUR, UTC).astimezone(tz) for i in range(n)]
    return Heatmap(hours=hours, rows=out_rows, per=per, left_out=max(0, len(ordered) - max_rows))


def _natural(label: str) -> tuple[object, ...]:
    """`n2/gpu10` after `n2/gpu9`: digits compare as numbers."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", label))
