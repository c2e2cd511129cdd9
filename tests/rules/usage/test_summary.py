"""The weekly Slack summary: week over week for the team, idle jobs with their scheduler job, each team's 13 weeks
against its target, and simulated usage said."""

from __future__ import annotations

from pathlib import Path

from gpuevents.cli.report import weekly_summary
from gpuevents.config import Config
from tests.gpuevents.cli.test_report import NOW, _fill
from tests.rules.dashboard import quarterweeks as qw


def test_the_summary_says_how_the_team_moved_since_last_week(tmp_path: Path) -> None:
    _fill(tmp_path / "u.sqlite")
    config = Config.model_validate({"engine": {"usage_db": str(tmp_path / "u.sqlite")},
                                    "costs": {"energy_price_kwh": 0}})
    text = weekly_summary(config, NOW, "vision", top_jobs=3)
    assert text is not None
    assert "Against last week: utilization 0% → 40% (+40.0 pts), held idle -83%" in text
    assert "• python (job 700001) on n1 GPU 0 (alice): 0.3 h idle, $0.24" in text
    assert weekly_summary(config, NOW, "nlp", top_jobs=3) is None  # nothing recorded for that team


def test_the_summary_says_each_teams_13_weeks_as_the_article_does_and_that_usage_is_simulated(
        tmp_path: Path) -> None:
    qw.write_quarter(tmp_path / "u.sqlite", simulated=True)
    config = Config.model_validate({"engine": {"usage_db": str(tmp_path / "u.sqlite")},
                                    "costs": {"energy_price_kwh": 0}, "teams": {"nlp": {"target_util_pct": 60}}})
    team = weekly_summary(config, qw.NOW, "nlp", top_jobs=3)
    assert team is not None
    kpi = [line for line in team.splitlines() if line.startswith("Utilization over 13 weeks")]
    assert kpi == ["Utilization over 13 weeks, nlp: 19 % → 58 % in 13 weeks (target 60 %)"]  # no "fleet" of one team
    assert "_Includes simulated usage (gpuevents simulate --history)._" in team
    fleet = weekly_summary(config, qw.NOW, None, top_jobs=3)
    assert fleet is not None
    assert "Utilization over 13 weeks, the fleet: 28 % → 54 % in 13 weeks" in fleet
    assert "Utilization over 13 weeks, nlp: 19 % → 58 % in 13 weeks (target 60 %)" in fleet
