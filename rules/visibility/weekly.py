"""The weekly usage report as data: per team and owner, fleet totals, top idle jobs, a heatmap. Pure."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from pydantic import BaseModel

from gpuevents.costs import CostModel
from rules.visibility.rollup import HOUR
from rules.visibility.store import IdleJobRow, UsageRow

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
    util_pct: float | None
    energy_kwh: float
    cost: float
    held_idle_cost: float
    unallocated_cost: float


class IdleJobLine(BaseModel):
    name: str
    node: str
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


def week_ending(now: datetime) -> tuple[datetime, datetime]:
    """The seven days that end at the start of the current hour."""
    end = datetime.fromtimestamp(int(now.timestamp()) // HOUR * HOUR, UTC)
    return end - WEEK, end


def team_label(team: str) -> str:
    return team or NO_TEAM_LABEL


@dataclass
class _Sum:
    busy_h: float = 0.0
    held_h: float = 0.0
    free_h: float = 0.0
    util_s: float = 0.0
    util_known_s: float = 0.0
    kwh: float = 0.0
    cost: float = 0.0
    held_cost: float = 0.0
    free_cost: float = 0.0

    def add(self, r: UsageRow, costs: CostModel) -> None:
        capital_h = costs.capital_daily(r.model or None) / 24
        self.busy_h += r.busy_s / HOUR
        self.held_h += r.held_s / HOUR
        self.free_h += r.free_s / HOUR
        self.util_s += r.util_s
        self.util_known_s += r.util_known_s
        self.kwh += r.busy_kwh + r.held_kwh + r.free_kwh
        held = capital_h * r.held_s / HOUR + costs.energy_cost(r.held_kwh)
        free = capital_h * r.free_s / HOUR + costs.energy_cost(r.free_kwh)
        busy = capital_h * r.busy_s / HOUR + costs.energy_cost(r.busy_kwh)
        self.held_cost += held
        self.free_cost += free
        self.cost += held + free + busy

    @property
    def util(self) -> float | None:
        return self.util_s / self.util_known_s if self.util_known_s > 0 else None


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
) -> WeeklyReport:
    """Add the stored hourly buckets of [since, until) up into the report."""
    rows = list(usage)
    fleet = _Sum()
    teams: dict[str, _Sum] = defaultdict(_Sum)
    owners: dict[tuple[str, str], _Sum] = defaultdict(_Sum)
    gpus: set[tuple[str, str, int]] = set()
    for r in rows:
        fleet.add(r, costs)
        teams[r.team].add(r, costs)
        if r.owner:
            owners[(r.team, r.owner)].add(r, costs)
        gpus.add((r.cluster, r.node, r.gpu))

    team_lines = []
    for name, t in teams.items():
        allocated = _Sum()
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
            team=name, busy_h=t.busy_h, held_idle_h=t.held_h, unallocated_h=t.free_h,
            util_pct=allocated.util, held_idle_cost=t.held_cost, unallocated_cost=t.free_cost,
            owners=owner_lines,
        ))
    team_lines.sort(key=lambda t: (-t.waste_cost, t.team))

    return WeeklyReport(
        since=since, until=until, timezone=timezone, team=team, currency=costs.currency,
        generated_at=generated_at,
        fleet=FleetTotals(
            gpus=len(gpus), gpu_h=fleet.busy_h + fleet.held_h + fleet.free_h, busy_h=fleet.busy_h,
            held_idle_h=fleet.held_h, unallocated_h=fleet.free_h, util_pct=fleet.util,
            energy_kwh=fleet.kwh, cost=fleet.cost, held_idle_cost=fleet.held_cost,
            unallocated_cost=fleet.free_cost,
        ),
        teams=team_lines,
        top_idle_jobs=_top_jobs(idle_jobs, costs, top_jobs),
        heatmap=_heatmap(rows, since, until, ZoneInfo(timezone), max_heatmap_rows),
    )


def _top_jobs(jobs: Iterable[IdleJobRow], costs: CostModel, limit: int) -> list[IdleJobLine]:
    acc: dict[tuple[str, str, str], IdleJobLine] = {}
    for j in jobs:
        key = (j.cluster, j.node, j.job)
        cost = costs.capital_daily(j.model or None) / 24 * j.held_s / HOUR + costs.energy_cost(j.held_kwh)
        line = acc.get(key)
        if line is None:
            acc[key] = IdleJobLine(name=j.name, node=j.node, gpus=[j.gpu], owner=j.owner, team=j.team,
                                   held_idle_h=j.held_s / HOUR, cost=cost)
        else:
            if j.gpu not in line.gpus:
                line.gpus.append(j.gpu)
            line.held_idle_h += j.held_s / HOUR
            line.cost += cost
    out = sorted(acc.values(), key=lambda j: (-j.cost, j.name))[:limit]
    for line in out:
        line.gpus.sort()
    return out


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
        total_s[key][i] += r.busy_s + r.held_s + r.free_s
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
