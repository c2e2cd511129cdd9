"""Week over week per team (the KPI: utilization and waste, and how they moved) and the owners' leaderboard of
held-idle GPU-hours. Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel

from gpuevents.costs import CostModel
from rules.usage.store import UsageRow
from rules.usage.sums import UsageSum


@dataclass
class TeamSums:
    """One team's (or the fleet's) totals: every row, and the rows somebody held (utilization is counted over
    the time an owner held a GPU, so free GPUs do not drag it down)."""

    all: UsageSum = field(default_factory=UsageSum)
    held: UsageSum = field(default_factory=UsageSum)

    def add(self, r: UsageRow, costs: CostModel) -> None:
        self.all.add(r, costs)
        if r.owner:
            self.held.add(r, costs)

    @property
    def waste_cost(self) -> float:
        return self.all.held_cost + self.all.free_cost


def team_sums(rows: Iterable[UsageRow], costs: CostModel) -> tuple[TeamSums, dict[str, TeamSums]]:
    """The fleet's and each team's totals."""
    fleet = TeamSums()
    teams: dict[str, TeamSums] = defaultdict(TeamSums)
    for r in rows:
        fleet.add(r, costs)
        teams[r.team].add(r, costs)
    return fleet, dict(teams)


class Trend(BaseModel):
    """This week against the week before, for one team (`team` None: the fleet). `prev_*` is None when the team
    recorded nothing the week before; changes are None when either side is unknown."""

    team: str | None
    util_pct: float | None
    prev_util_pct: float | None
    util_change_pts: float | None  # percentage points
    busy_share_pct: float | None  # of the GPU-hours held, the share used
    prev_busy_share_pct: float | None
    busy_share_change_pts: float | None
    held_idle_h: float
    prev_held_idle_h: float | None
    held_idle_change_pct: float | None
    waste_cost: float  # held idle + unallocated
    prev_waste_cost: float | None
    waste_change_pct: float | None


class WeekOverWeek(BaseModel):
    fleet: Trend
    teams: list[Trend]  # in the order of the report's teams


def _pts(now: float | None, before: float | None) -> float | None:
    return None if now is None or before is None else now - before


def _pct(now: float, before: float | None) -> float | None:
    return None if before is None or before <= 0 else 100.0 * (now - before) / before


def trend(team: str | None, now: TeamSums, before: TeamSums | None) -> Trend:
    prev_util = before.held.util if before is not None else None
    prev_share = before.all.busy_share if before is not None else None
    prev_held = before.all.held_h if before is not None else None
    prev_waste = before.waste_cost if before is not None else None
    return Trend(
        team=team,
        util_pct=now.held.util, prev_util_pct=prev_util, util_change_pts=_pts(now.held.util, prev_util),
        busy_share_pct=now.all.busy_share, prev_busy_share_pct=prev_share,
        busy_share_change_pts=_pts(now.all.busy_share, prev_share),
        held_idle_h=now.all.held_h, prev_held_idle_h=prev_held, held_idle_change_pct=_pct(now.all.held_h, prev_held),
        waste_cost=now.waste_cost, prev_waste_cost=prev_waste, waste_change_pct=_pct(now.waste_cost, prev_waste),
    )


def week_over_week(current: Iterable[UsageRow], previous: Iterable[UsageRow], costs: CostModel,
                   team_order: list[str]) -> WeekOverWeek:
    """Each team of `team_order` (and the fleet) this week against the week before."""
    fleet, teams = team_sums(current, costs)
    prev_fleet, prev_teams = team_sums(previous, costs)
    return WeekOverWeek(
        fleet=trend(None, fleet, prev_fleet if prev_fleet.all.gpu_h > 0 else None),
        teams=[trend(t, teams.get(t, TeamSums()), prev_teams.get(t)) for t in team_order],
    )


class LeaderLine(BaseModel):
    """One owner on the leaderboard of held-idle GPU-hours (most money first)."""

    rank: int
    owner: str
    teams: list[str]
    held_idle_h: float
    held_idle_cost: float
    busy_h: float
    util_pct: float | None
    busy_share_pct: float | None  # of the GPU-hours the owner held, the share used


def leaderboard(rows: Iterable[UsageRow], costs: CostModel, limit: int = 20) -> list[LeaderLine]:
    """Owners who held GPUs idle, most costly first, across their teams."""
    sums: dict[str, UsageSum] = defaultdict(UsageSum)
    teams: dict[str, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if not r.owner:
            continue
        sums[r.owner].add(r, costs)
        held = teams[r.owner]
        held[r.team] = held.get(r.team, 0.0) + r.held_s + r.busy_s
    ranked = sorted((o for o in sums if sums[o].held_h > 0), key=lambda o: (-sums[o].held_cost, o))[:limit]
    return [
        LeaderLine(rank=i + 1, owner=o, teams=sorted(teams[o], key=lambda t: (-teams[o][t], t)),
                   held_idle_h=sums[o].held_h, held_idle_cost=sums[o].held_cost, busy_h=sums[o].busy_h,
                   util_pct=sums[o].util, busy_share_pct=sums[o].busy_share)
        for i, o in enumerate(ranked)
    ]
