"""Keeps in the weekly report, from real rollups: snapshots through the aggregator into the usage store, keeps
into its `keeps` table, then the report (JSON, Markdown, HTML) and the Slack summary per team."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from actions import slack_format
from gpuevents.cli import app
from gpuevents.config import Config
from gpuevents.costs import CostModel
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, make_event
from rules.usage.keeps import KeepRow, KeepStore, KeptGpu, team_keeps
from rules.usage.rollup import TeamResolver, UsageAggregator
from rules.usage.store import UsageStore
from rules.usage.summary import summary_text
from rules.usage.weekly import WeeklyReport

NOW = datetime(2026, 1, 14, 10, 30, tzinfo=UTC)
START = datetime(2026, 1, 13, 9, 0, tzinfo=UTC)  # two hours of use in the report's week: 09:00-11:00


def _snapshot(at: datetime, node: str, team: str) -> NodeSnapshot:
    """GPU 0 held idle by alice, GPU 1 busy with bob's job."""
    gpus = [GpuInfo(node=node, index=0, model="NVIDIA H100", util_pct=0, idle=True, pids=[7]),
            GpuInfo(node=node, index=1, model="NVIDIA H100", util_pct=90, pids=[8])]
    procs = [ProcessInfo(node=node, pid=7, name="python", user="alice", create_time=START, gpus=[0]),
             ProcessInfo(node=node, pid=8, name="python", user="bob", create_time=START, gpus=[1])]
    return NodeSnapshot(node=NodeInfo(name=node, labels={"team": team}), gpus=gpus, processes=procs)


def _fill(path: Path) -> None:
    agg = UsageAggregator(snapshot_interval=60, teams=TeamResolver())
    for node, team in (("n1", "vision"), ("n2", "nlp")):
        for m in range(121):
            at = START + timedelta(minutes=m)
            agg.observe(make_event("node.snapshot", node, _snapshot(at, node, team), time=at), at)
        agg.forget("default", node)
    with UsageStore(path) as store:
        store.add(agg.drain())


def _keep(id: str, entity: str, node: str, gpu: int, start: datetime, hours: float, reason: str,
          **more: object) -> KeepRow:
    until = (start + timedelta(hours=hours)).timestamp()
    return KeepRow(id=id, cluster="default", rule="idle-held", entity_id=entity, gpus=(KeptGpu(node, gpu),),
                   by="alice", reason=reason, start=start.timestamp(), until=until, asked_until=until,
                   **more)  # type: ignore[arg-type]  # keyword overrides


@pytest.fixture
def usage_db(tmp_path: Path) -> Path:
    path = tmp_path / "usage.sqlite"
    _fill(path)
    with KeepStore(path) as keeps:
        keeps.add(_keep("k1", "n1/gpu0", "n1", 0, START, 2, "waiting for the dataset copy"))  # idle all along
        keeps.add(_keep("k2", "n1/gpu1", "n1", 1, START, 1, "benchmark in progress"))  # busy all along
        keeps.add(_keep("k3", "n2/gpu0", "n2", 0, START, 0.5, "debugging"))
        keeps.add(_keep("k0", "n9/gpu0", "n9", 0, START - timedelta(days=9), 2, "last month"))  # not this week
    return path


def test_each_teams_keeps_count_their_reasons_gpu_hours_and_idle_share(usage_db: Path) -> None:
    since, until = (NOW - timedelta(days=7)).timestamp(), NOW.timestamp()
    with UsageStore(usage_db) as store, KeepStore(usage_db) as keeps:
        lines = team_keeps(keeps.window(since, until), store.usage(since, until), since, until)
    by_team = {t.team: t for t in lines}
    assert list(by_team) == ["vision", "nlp"]  # most kept GPU-hours first
    vision = by_team["vision"]
    assert (vision.count, vision.kept_gpu_hours) == (2, 3.0)
    assert vision.idle_share_pct == pytest.approx(100 * 2 / 3, abs=0.1)  # 2 of the 3 kept GPU-hours were idle
    assert [(r.entity_id, r.reason, r.gpu_hours, r.idle_share_pct) for r in vision.reasons] == [
        ("n1/gpu0", "waiting for the dataset copy", 2.0, 100.0), ("n1/gpu1", "benchmark in progress", 1.0, 0.0)]
    assert (by_team["nlp"].count, by_team["nlp"].kept_gpu_hours, by_team["nlp"].idle_share_pct) == (1, 0.5, 100.0)


def test_a_keep_replaced_extended_by_approval_or_lifted_is_counted_once_for_its_kept_time(tmp_path: Path) -> None:
    with KeepStore(tmp_path / "u.sqlite") as keeps:
        keeps.add(_keep("a", "n1/gpu0", "n1", 0, START, 24, "first"))
        keeps.add(_keep("b", "n1/gpu0", "n1", 0, START + timedelta(hours=1), 24, "again"))  # replaces the first
        approved = _keep("c", "n1/gpu0", "n1", 0, START + timedelta(hours=2), 72, "again", approved_by="U2 in #x")
        keeps.add(approved)  # the approved rest of "b": the same keep, longer
        rows = keeps.window(0, 2e9)
        assert [(r.id, r.reason, r.until - r.start, r.approved_by) for r in rows] == [
            ("a", "first", 3600.0, ""), ("b", "again", 73 * 3600.0, "U2 in #x")]
        keeps.lift("default", "idle-held", "n1/gpu0", (START + timedelta(hours=5)).timestamp())
        assert [r.until - r.start for r in keeps.window(0, 2e9)] == [3600.0, 4 * 3600.0]


def test_the_report_and_the_slack_summary_show_the_keeps(usage_db: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"engine:\n  usage_db: {usage_db}\ncosts:\n  energy_price_kwh: 0\n")
    monkeypatch.setattr("gpuevents.cli.report.SystemClock.now", lambda self: NOW)
    out = CliRunner().invoke(app, ["report", "--format", "json", "-c", str(cfg)])
    assert out.exit_code == 0, out.output
    report = WeeklyReport.model_validate(json.loads(out.output))
    assert [(t.team, t.count, t.kept_gpu_hours) for t in report.keeps] == [("vision", 2, 3.0), ("nlp", 1, 0.5)]
    md = CliRunner().invoke(app, ["report", "--format", "md", "-c", str(cfg)]).output
    assert "| vision | 2 | 3.0 | 67% | n1/gpu0 (alice)\\: waiting for the dataset copy; n1/gpu1 (alice)\\: " in md
    html = CliRunner().invoke(app, ["report", "--format", "html", "-c", str(cfg)]).output
    assert 'id="keeps"' in html and "waiting for the dataset copy" in html
    team = CliRunner().invoke(app, ["report", "--format", "json", "--team", "nlp", "-c", str(cfg)]).output
    assert [t.team for t in WeeklyReport.model_validate(json.loads(team)).keeps] == ["nlp"]
    text = summary_text(report, CostModel(Config().costs), 3, escape=slack_format.escape, cut=slack_format.truncate)
    assert "Keeps, vision: 2 (3.0 GPU-h kept, 67% of it idle); why: waiting for the dataset copy; benchmark" in text


def test_the_report_lists_the_keep_budgets(usage_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"engine:\n  usage_db: {usage_db}\nkeep_budget:\n  per_owner: 3\n"
                   "teams:\n  vision:\n    keeps_per_week: 5\n")
    monkeypatch.setattr("gpuevents.cli.report.SystemClock.now", lambda self: NOW)
    out = CliRunner().invoke(app, ["report", "--format", "json", "-c", str(cfg)])
    report = WeeklyReport.model_validate(json.loads(out.output))
    assert [(t.team, t.count, t.budget, t.at_budget) for t in report.keeps] == [
        ("vision", 2, 5, ["alice 3 of 3"]), ("nlp", 1, None, ["alice 3 of 3"])]
    md = CliRunner().invoke(app, ["report", "--format", "md", "-c", str(cfg)]).output
    assert "| vision | 2 of 5 (budget used\\: alice 3 of 3) | 3.0 |" in md
