"""The weekly Slack summary: week over week for the team, and idle jobs with their scheduler job."""

from __future__ import annotations

from pathlib import Path

from gpuevents.cli.report import weekly_summary
from gpuevents.config import Config
from tests.gpuevents.cli.test_report import NOW, _fill


def test_the_summary_says_how_the_team_moved_since_last_week(tmp_path: Path) -> None:
    _fill(tmp_path / "u.sqlite")
    config = Config.model_validate({"engine": {"usage_db": str(tmp_path / "u.sqlite")},
                                    "costs": {"energy_price_kwh": 0}})
    text = weekly_summary(config, NOW, "vision", top_jobs=3)
    assert text is not None
    assert "Against last week: utilization 0% → 40% (+40.0 pts), held idle -83%" in text
    assert "• python (job 700001) on n1 GPU 0 (alice): 0.3 h idle, $0.24" in text
    assert weekly_summary(config, NOW, "nlp", top_jobs=3) is None  # nothing recorded for that team
