"""`gpuevents report`: the current hour counts, week over week per team, the leaderboard, job ids."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuevents.cli import app
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, make_event
from rules.usage.rollup import TeamResolver, UsageAggregator
from rules.usage.store import UsageStore

NOW = datetime(2026, 1, 14, 10, 30, tzinfo=UTC)  # a Wednesday, half past ten


def _snapshot(at: datetime, *, bob_busy: bool) -> NodeSnapshot:
    alice = ProcessInfo(node="n1", pid=7, name="python", user="alice", create_time=at - timedelta(hours=1),
                        gpus=[0], job="700001")
    gpus = [GpuInfo(node="n1", index=0, model="NVIDIA H100", util_pct=0, idle=True, pids=[7])]
    procs = [alice]
    if bob_busy:
        gpus.append(GpuInfo(node="n1", index=1, model="NVIDIA H100", util_pct=80, pids=[8]))
        procs.append(ProcessInfo(node="n1", pid=8, name="python", user="bob", create_time=at, gpus=[1]))
    return NodeSnapshot(node=NodeInfo(name="n1", labels={"team": "vision"}), gpus=gpus, processes=procs)


def _fill(path: Path) -> None:
    """Last week: alice held GPU 0 idle for two hours. This week: only the current hour, 10:05–10:25, alice's GPU
    held idle and bob's busy."""
    agg = UsageAggregator(snapshot_interval=60, teams=TeamResolver())
    spans = [(datetime(2026, 1, 5, 10, tzinfo=UTC), 120, False), (NOW - timedelta(minutes=25), 20, True)]
    for start, minutes, bob in spans:
        for m in range(minutes + 1):
            at = start + timedelta(minutes=m)
            agg.observe(make_event("node.snapshot", "n1", _snapshot(at, bob_busy=bob), time=at), at)
        agg.forget("default", "n1")
    with UsageStore(path) as store:
        store.add(agg.drain())


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _fill(tmp_path / "usage.sqlite")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"engine:\n  usage_db: {tmp_path / 'usage.sqlite'}\ncosts:\n  energy_price_kwh: 0\n")
    monkeypatch.setattr("gpuevents.cli.report.SystemClock.now", lambda self: NOW)
    return cfg


def test_report_counts_the_current_hour_and_compares_with_last_week(config: Path) -> None:
    result = CliRunner().invoke(app, ["report", "--format", "json", "-c", str(config)])
    assert result.exit_code == 0, result.output
    r = json.loads(result.output)
    assert r["until"].startswith("2026-01-14T10:30")
    assert r["fleet"]["gpus"] == 2
    assert r["fleet"]["gpu_h"] == pytest.approx(2 * 20 / 60)  # all of it in the current hour
    assert r["fleet"]["held_idle_h"] == pytest.approx(20 / 60)
    assert [c is not None for c in r["heatmap"]["rows"][0]["cells"][-2:]] == [False, True]
    vision = r["week_over_week"]["teams"][0]
    assert vision["team"] == "vision"
    assert (vision["prev_held_idle_h"], vision["held_idle_h"]) == pytest.approx((2.0, 20 / 60))
    assert vision["held_idle_change_pct"] == pytest.approx(100 * (20 / 60 - 2) / 2)
    assert (vision["prev_busy_share_pct"], vision["busy_share_pct"]) == pytest.approx((0.0, 50.0))
    assert [(o["rank"], o["owner"]) for o in r["leaderboard"]] == [(1, "alice")]
    assert r["leaderboard"][0]["held_idle_h"] == pytest.approx(20 / 60)
    assert [(j["job_id"], j["owner"]) for j in r["top_idle_jobs"]] == [("700001", "alice")]


def test_markdown_and_html_reports_show_the_new_sections(config: Path) -> None:
    md = CliRunner().invoke(app, ["report", "--format", "md", "-c", str(config)]).output
    assert "| vision | 0% → 40% | +40.0 pts (better) | 0% → 50% | 2.0 → 0.3 | -83.3 % (better) |" in md
    assert "| 1 | alice | vision | 0.3 |" in md
    assert "| python (job 700001) | 700001 | n1 | 0 | alice | vision |" in md
    html = CliRunner().invoke(app, ["report", "--format", "html", "-c", str(config)]).output
    assert 'id="week-over-week"' in html and 'id="leaderboard"' in html
    assert "2.0 → 0.3</td><td><span class=\"up\">-83.3 % (better)</span>" in html


def test_markdown_is_accepted_as_the_long_name_of_md(config: Path) -> None:
    md = CliRunner().invoke(app, ["report", "--format", "md", "-c", str(config)])
    markdown = CliRunner().invoke(app, ["report", "--format", "markdown", "-c", str(config)])
    assert markdown.exit_code == 0, markdown.output
    assert markdown.output == md.output and "| 1 | alice | vision | 0.3 |" in markdown.output


def test_weeks_start_now_to_the_microsecond_and_a_team_report_has_no_fleet_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.rules.dashboard import quarterweeks as qw

    qw.write_quarter(tmp_path / "usage.sqlite", simulated=True)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"engine:\n  usage_db: {tmp_path / 'usage.sqlite'}\nteams:\n  nlp: {{target_util_pct: 60}}\n")
    now = qw.NOW.replace(microsecond=250_000)  # as the clock gives it: weeks start off the whole second
    monkeypatch.setattr("gpuevents.cli.report.SystemClock.now", lambda self: now)
    result = CliRunner().invoke(app, ["report", "--weeks", "13", "--format", "json", "-c", str(cfg)])
    q = json.loads(result.output)["quarter"]
    nlp = next(s for s in q["teams"] if s["team"] == "nlp")
    # every week in its own place: the rollups' 19 % first, 58 % last
    assert [round(p["util_pct"], 2) for p in nlp["points"]] == [round(19 + 3.25 * w, 2) for w in range(13)]
    md = CliRunner().invoke(app, ["report", "--weeks", "13", "--team", "nlp", "--format", "md", "-c", str(cfg)])
    assert "| nlp | 19 % → 58 % in 13 weeks (target 60 %) |" in md.output and "| Fleet |" not in md.output
    both = CliRunner().invoke(app, ["report", "--weeks", "4", "--team", "nlp", "--compare", "2026-01-14..2026-02-10",
                                    "--format", "md", "-c", str(cfg)]).output
    assert "## Before and after" in both and "| Fleet |" not in both.split("## Before and after")[1]
