"""Utilization as a team KPI over many weeks: per team and week, utilization while held, held-idle GPU-hours and
their cost, against the team's target; and one period against another (before and after). Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from pydantic import BaseModel, computed_field

from gpuevents.costs import CostModel
from rules.usage.store import UsageRow
from rules.usage.trends import TeamSums

WEEK = timedelta(days=7)


class WeekPoint(BaseModel):
    """One team's (or the fleet's) week."""

    week_start: datetime
    util_pct: float | None  # utilization over the GPU-time somebody held
    held_idle_h: float
    held_idle_cost: float
    gpu_h: float


class TeamSeries(BaseModel):
    team: str | None  # None: the whole fleet
    target_util_pct: float | None
    points: list[WeekPoint]

    @property
    def known(self) -> list[WeekPoint]:
        return [p for p in self.points if p.util_pct is not None]

    @property
    def first_util_pct(self) -> float | None:
        known = self.known
        return known[0].util_pct if known else None

    @property
    def last_util_pct(self) -> float | None:
        known = self.known
        return known[-1].util_pct if known else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def on_target(self) -> bool | None:
        last = self.last_util_pct
        return None if self.target_util_pct is None or last is None else last >= self.target_util_pct

    def change_text(self) -> str:
        """`19 % → 58 % in 13 weeks (target 60 %)`, or `no usage recorded`."""
        known = self.known
        if not known:
            return "no usage recorded"
        first, last = known[0], known[-1]
        weeks = round((last.week_start - first.week_start) / WEEK) + 1
        text = (f"{first.util_pct:.0f} % → {last.util_pct:.0f} % in {weeks} week{'s' if weeks != 1 else ''}"
                if weeks > 1 else f"{last.util_pct:.0f} % this week")
        if self.target_util_pct is not None:
            text += f" (target {self.target_util_pct:.0f} %)"
        return text

    @computed_field  # type: ignore[prop-decorator]
    @property
    def change(self) -> str:
        """`change_text()`, for pages that draw the series."""
        return self.change_text()


class PeriodTotals(BaseModel):
    """The whole period's fleet figures, added up (what `report --since --until --format json` gives as `fleet`)."""

    gpu_h: float = 0.0
    busy_h: float = 0.0
    held_idle_h: float = 0.0
    unallocated_h: float = 0.0
    util_pct: float | None = None
    energy_kwh: float = 0.0
    cost: float = 0.0
    held_idle_cost: float = 0.0
    unallocated_cost: float = 0.0


class QuarterReport(BaseModel):
    since: datetime
    until: datetime
    weeks: list[datetime]
    fleet: TeamSeries
    teams: list[TeamSeries]  # most held-idle cost first
    currency: str
    simulated: bool = False
    """Some hours of the period were simulated (gpuevents simulate --history)."""
    imported: bool = False
    """Some hours of the period were imported (gpuevents import), not recorded live."""
    total: PeriodTotals = PeriodTotals()
    team: str | None = None  # one team's report: its rows only, so no fleet line is shown (it would be the team's)

    def lines(self) -> list[TeamSeries]:
        """The series to show: the fleet's and every team's, or the one team's."""
        return [self.fleet, *self.teams] if self.team is None else [s for s in self.teams if s.team == self.team]


class PeriodLine(BaseModel):
    team: str | None
    util_pct: float | None
    held_idle_h: float
    held_idle_cost: float
    gpu_h: float


class Comparison(BaseModel):
    """Period B (after) against period A (before), per team and for the fleet."""

    before: tuple[datetime, datetime]
    after: tuple[datetime, datetime]
    rows: list[tuple[PeriodLine, PeriodLine]]  # (before, after); the fleet first


def week_starts(since: datetime, until: datetime) -> list[datetime]:
    out = []
    t = since
    while t < until:
        out.append(t)
        t += WEEK
    return out


def _point(start: datetime, sums: TeamSums | None) -> WeekPoint:
    if sums is None:
        return WeekPoint(week_start=start, util_pct=None, held_idle_h=0.0, held_idle_cost=0.0, gpu_h=0.0)
    return WeekPoint(week_start=start, util_pct=sums.held.util, held_idle_h=sums.all.held_h,
                     held_idle_cost=sums.all.held_cost, gpu_h=sums.all.gpu_h)


def build_quarter(rows: Iterable[UsageRow], costs: CostModel, since: datetime, until: datetime,
                  targets: Mapping[str, float | None], simulated: bool = False,
                  team: str | None = None) -> QuarterReport:
    """Week by week from `since` (the first week's start) until `until`, per team and the fleet."""
    weeks = week_starts(since, until)
    t0 = since.timestamp()
    fleet: dict[int, TeamSums] = defaultdict(TeamSums)
    teams: dict[str, dict[int, TeamSums]] = defaultdict(lambda: defaultdict(TeamSums))
    total = TeamSums()
    for r in rows:
        w = int((r.hour - t0) // WEEK.total_seconds())
        if not 0 <= w < len(weeks):
            continue
        total.add(r, costs)
        fleet[w].add(r, costs)
        teams[r.team][w].add(r, costs)
    for name in targets:
        teams.setdefault(name, defaultdict(TeamSums))

    def series(name: str | None, by_week: Mapping[int, TeamSums]) -> TeamSeries:
        return TeamSeries(team=name, target_util_pct=targets.get(name) if name is not None else None,
                          points=[_point(start, by_week.get(i)) for i, start in enumerate(weeks)])

    lines = [series(name, by_week) for name, by_week in teams.items()]
    # a team with nothing held (free GPUs carry no team) and no target has no line to show
    lines = [s for s in lines if s.known or s.target_util_pct is not None or any(p.held_idle_h for p in s.points)]
    lines.sort(key=lambda s: (-sum(p.held_idle_cost for p in s.points), s.team or ""))
    return QuarterReport(since=since, until=until, weeks=weeks, fleet=series(None, fleet), teams=lines,
                         currency=costs.currency, simulated=simulated, team=team, total=_totals(total))


def _totals(t: TeamSums) -> PeriodTotals:
    a = t.all
    return PeriodTotals(gpu_h=a.gpu_h, busy_h=a.busy_h, held_idle_h=a.held_h, unallocated_h=a.free_h,
                        util_pct=t.held.util, energy_kwh=a.kwh, cost=a.cost, held_idle_cost=a.held_cost,
                        unallocated_cost=a.free_cost)


def _line(team: str | None, sums: TeamSums | None) -> PeriodLine:
    if sums is None:
        return PeriodLine(team=team, util_pct=None, held_idle_h=0.0, held_idle_cost=0.0, gpu_h=0.0)
    return PeriodLine(team=team, util_pct=sums.held.util, held_idle_h=sums.all.held_h,
                      held_idle_cost=sums.all.held_cost, gpu_h=sums.all.gpu_h)


def compare(before_rows: Iterable[UsageRow], after_rows: Iterable[UsageRow], costs: CostModel,
            before: tuple[datetime, datetime], after: tuple[datetime, datetime],
            team: str | None = None) -> Comparison:
    """Each team (and the fleet) in one period against another; with `team`, that team alone."""
    sides: list[tuple[TeamSums, dict[str, TeamSums]]] = []
    for rows in (before_rows, after_rows):
        fleet = TeamSums()
        teams: dict[str, TeamSums] = defaultdict(TeamSums)
        for r in rows:
            fleet.add(r, costs)
            teams[r.team].add(r, costs)
        sides.append((fleet, teams))
    (fa, ta), (fb, tb) = sides
    names = sorted(set(ta) | set(tb))
    lines = [(_line(None, fa), _line(None, fb))]
    lines += [(_line(t, ta.get(t)), _line(t, tb.get(t))) for t in names]
    lines = lines[:1] + [(a, b) for a, b in lines[1:]  # as above: a team that held nothing in either period is no row
                         if a.util_pct is not None or b.util_pct is not None or a.held_idle_h or b.held_idle_h]
    if team is not None:  # the rows are the team's: the "fleet" is the team again
        lines = [(a, b) for a, b in lines[1:] if a.team == team]
    return Comparison(before=before, after=after, rows=lines)
