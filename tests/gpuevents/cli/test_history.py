"""`gpuevents simulate --history`: a first report with a week in it, written once."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuevents.cli import app

NOW = datetime(2026, 1, 14, 10, 30, tzinfo=UTC)


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"engine:\n  usage_db: {tmp_path / 'usage.sqlite'}\nagent:\n  node_name: gpu-node-1\n")
    monkeypatch.setattr("gpuevents.clock.SystemClock.now", lambda self: NOW)
    return cfg


def test_history_gives_a_first_report_a_week_of_data_and_is_written_once(config: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["simulate", "--history", "14d", "-c", str(config)])
    assert result.exit_code == 0, result.output
    assert "SIMULATED usage for gpu-node-1 (8 GPUs each): 336 node-hours" in result.output
    again = runner.invoke(app, ["simulate", "--history", "14d", "-c", str(config)])
    assert "0 node-hours" in again.output and "336 node-hours already had usage" in again.output

    report = json.loads(runner.invoke(app, ["report", "--format", "json", "-c", str(config)]).output)
    assert report["fleet"]["gpus"] == 8
    assert report["fleet"]["gpu_h"] == pytest.approx(8 * 167)  # the history stops where the current hour starts
    assert report["fleet"]["held_idle_h"] > 0 and report["leaderboard"] and report["top_idle_jobs"]
    assert {t["team"] for t in report["teams"]} >= {"vision", "nlp", "speech"}
    assert report["week_over_week"]["fleet"]["prev_held_idle_h"] > report["week_over_week"]["fleet"]["held_idle_h"]


def test_a_bad_history_says_what_to_write(config: Path) -> None:
    result = CliRunner().invoke(app, ["simulate", "--history", "a while", "-c", str(config)])
    assert result.exit_code == 2 and "--history" in result.output
    result = CliRunner().invoke(app, ["simulate", "--history", "400d", "-c", str(config)])
    assert result.exit_code == 2 and "at most 100d" in result.output
