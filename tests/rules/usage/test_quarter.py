"""The KPI over many weeks, pure: rows bucketed into weeks from `since`, utilization while held against the team's
target, "19 % → 58 % in 13 weeks", teams with nothing to show left out, and one period against another."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuevents.config import CostsConfig, GpuCost
from gpuevents.costs import CostModel
from rules.usage.quarter import build_quarter, compare
from rules.usage.store import UsageRow

COSTS = CostModel(CostsConfig(energy_price_kwh=0, models={"H100": GpuCost(price=8760, depreciation_years=1)}))
SINCE = datetime(2026, 1, 5, tzinfo=UTC)


def _row(day: int, team: str, util: float, owner: str = "u") -> UsageRow:
    hour = int((SINCE + timedelta(days=day, hours=9)).timestamp())
    busy = 3600 * util / 100 if owner else 0.0
    held = 3600 - busy if owner else 0.0
    return UsageRow(hour, "c", "n", 0, owner, team, "H100", busy, held, 0.0 if owner else 3600.0,
                    util * 3600 if owner else 0.0, 3600.0 if owner else 0.0, 0, 0, 0)


def _quarter_rows() -> list[UsageRow]:
    rows = [_row(7 * w + d, "nlp", 19 + 3.25 * w) for w in range(13) for d in range(0, 7, 2)]
    rows += [_row(d, "", 0, owner="") for d in range(91)]  # free GPUs: no owner, no team
    return rows


def test_each_week_is_the_held_utilization_of_its_rows_and_the_change_is_said_as_the_article_does() -> None:
    q = build_quarter(_quarter_rows(), COSTS, SINCE, SINCE + timedelta(weeks=13), {"nlp": 60.0, "vision": 50.0})
    assert len(q.weeks) == 13
    nlp = next(s for s in q.teams if s.team == "nlp")
    assert [p.util_pct for p in nlp.points] == [19 + 3.25 * w for w in range(13)]
    assert nlp.change_text() == "19 % → 58 % in 13 weeks (target 60 %)" and nlp.on_target is False
    assert round(nlp.points[0].held_idle_h, 3) == round(4 * 0.81, 3)  # four hours held at 19 %
    # a team with a target but no usage keeps its line (the target is news); free GPUs' "" team has none
    vision = next(s for s in q.teams if s.team == "vision")
    assert vision.change_text() == "no usage recorded" and vision.target_util_pct == 50
    assert "" not in [s.team for s in q.teams]
    # the fleet counts free GPUs in its cost, not in utilization while held
    assert q.fleet.points[0].util_pct == 19 and q.fleet.points[0].gpu_h == 4 + 7


def test_a_comparison_has_the_fleet_first_and_leaves_out_teams_that_held_nothing_in_either_period() -> None:
    rows = _quarter_rows()
    first = SINCE.timestamp() + 4 * 7 * 86400
    before = [r for r in rows if r.hour < first]
    after = [r for r in rows if r.hour >= SINCE.timestamp() + 9 * 7 * 86400]
    c = compare(before, after, COSTS, (SINCE, SINCE + timedelta(weeks=4)),
                (SINCE + timedelta(weeks=9), SINCE + timedelta(weeks=13)))
    assert [a.team for a, _b in c.rows] == [None, "nlp"]
    (a, b) = c.rows[1]
    assert a.util_pct is not None and b.util_pct is not None and b.util_pct - a.util_pct > 25


def test_one_teams_report_shows_that_team_not_a_fleet_made_of_it() -> None:
    nlp_rows = [r for r in _quarter_rows() if r.team == "nlp"]  # what a team's report reads
    q = build_quarter(nlp_rows, COSTS, SINCE, SINCE + timedelta(weeks=13), {"nlp": 60.0}, team="nlp")
    assert [s.team for s in q.lines()] == ["nlp"]
    whole = build_quarter(_quarter_rows(), COSTS, SINCE, SINCE + timedelta(weeks=13), {"nlp": 60.0})
    assert [s.team for s in whole.lines()] == [None, "nlp"]
    c = compare(nlp_rows[:10], nlp_rows[-10:], COSTS, (SINCE, SINCE), (SINCE, SINCE), team="nlp")
    assert [a.team for a, _b in c.rows] == ["nlp"]
