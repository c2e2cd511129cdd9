"""The weekly report: hand-computed money and hours in HTML, Markdown and JSON; escaping; the CLI."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gpuevents.cli.report import report_command
from gpuevents.config import CostsConfig, GpuCost
from gpuevents.costs import CostModel
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, make_event
from rules.usage.render import render_html, render_markdown
from rules.usage.rollup import TeamResolver, UsageAggregator
from rules.usage.store import UsageStore
from rules.usage.weekly import WeeklyReport, build_report, week_ending
from tests.rules.dashboard.fleetday import DAY_START, TEAMS, day_events

# Round numbers so the money can be worked out by hand: an H100 costs 100 a day (+ energy at 0.50
# per kWh), an A100 24 a day, i.e. 1 an hour.
COSTS = CostsConfig(
    currency="USD", energy_price_kwh=0.5, pue=1.0,
    models={"H100": GpuCost(price=36500, depreciation_years=1, rated_power_w=700),
            "A100": GpuCost(price=8760, depreciation_years=1, rated_power_w=400)},
)
NOW = DAY_START + timedelta(days=1, minutes=30)
# alice: 4 h held idle on an H100 at 100 W: 4 × 100/24 + 0.4 kWh × 0.5 = 16.8667
# bob, carol: 3 h each on the A100 at a rated 400 W: 3 × 1 + 1.2 kWh × 0.5 = 3.60
# unallocated on n1: 32.0667 GPU-h × 100/24 + 3.20667 kWh × 0.5 = 135.2144
# busy: alice 8 h → 33.3333 + 0.4 = 33.7333; bob 18 h → 18 + 3.6 = 21.60
HELD_ALICE, HELD_BOB = 4 * 100 / 24 + 0.2, 3.6
FREE_N1_H = 2 * (24 - (1 + 58 / 60)) - 12
FREE_N1 = FREE_N1_H * 100 / 24 + FREE_N1_H * 0.1 * 0.5
TOTAL = HELD_ALICE + 2 * HELD_BOB + FREE_N1 + (8 * 100 / 24 + 0.4) + 21.6


def _fill(path: Path, extra_pod: str | None = None) -> None:
    costs = CostModel(COSTS)
    agg = UsageAggregator(snapshot_interval=60, teams=TeamResolver(teams=TEAMS),
                          rated_power_w=lambda m: costs.gpu_cost(m).rated_power_w)
    for e in day_events():
        agg.observe(e, e.time)
    if extra_pod is not None:  # a node whose pod name is hostile, held idle for a minute
        for t in (0, 60):
            snap = NodeSnapshot(
                node=NodeInfo(name="n3<b>"),
                gpus=[GpuInfo(node="n3<b>", index=0, util_pct=0, idle=True, pids=[7])],
                processes=[ProcessInfo(node="n3<b>", pid=7, owner="mallory<i>@x", pod=extra_pod,
                                       create_time=DAY_START)],
            )
            at = DAY_START + timedelta(hours=20, seconds=t)
            agg.observe(make_event("node.snapshot", "n3<b>", snap, time=at), at)
    agg.settle(DAY_START + timedelta(days=1))
    with UsageStore(path) as store:
        store.add(agg.drain())


def _report(path: Path, team: str | None = None) -> WeeklyReport:
    since, until = week_ending(NOW)
    with UsageStore(path) as store:
        usage = store.usage(since.timestamp(), until.timestamp(), team)
        jobs = store.idle_jobs(since.timestamp(), until.timestamp(), team)
    return build_report(usage, jobs, CostModel(COSTS), since=since, until=until, generated_at=NOW,
                        timezone="Asia/Shanghai", team=team)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("usage") / "usage.sqlite"
    _fill(path)
    return path


def test_report_totals_match_the_hand_computed_money(store_path: Path) -> None:
    r = _report(store_path)
    assert r.fleet.gpus == 3
    assert r.fleet.held_idle_cost == pytest.approx(HELD_ALICE + 2 * HELD_BOB)
    assert r.fleet.unallocated_cost == pytest.approx(FREE_N1)
    assert r.fleet.cost == pytest.approx(TOTAL)
    vision = next(t for t in r.teams if t.team == "vision")
    assert [o.owner for o in vision.owners] == ["alice@example.com"]
    assert vision.owners[0].held_idle_cost == pytest.approx(HELD_ALICE)
    assert vision.owners[0].util_pct == pytest.approx(60)
    assert vision.unallocated_h == pytest.approx(FREE_N1_H)


def test_teams_are_ordered_by_waste(store_path: Path) -> None:
    assert [t.team for t in _report(store_path).teams] == ["vision", "", "nlp"]


def test_html_report_shows_the_expected_numbers(store_path: Path) -> None:
    html = render_html(_report(store_path), CostModel(COSTS))
    assert '<b id="fleet-gpus">3</b>' in html
    assert '<b id="fleet-held-cost">$24.07</b>' in html
    assert '<b id="fleet-free-cost">$135.21</b>' in html
    assert f'<b id="fleet-cost">${TOTAL:,.2f}</b>' in html
    alice_row = re.search(r"<tr><td class=\"t\">&nbsp;&nbsp;alice@example.com</td>(.*?)</tr>", html)
    assert alice_row is not None
    assert "<td>8.0</td><td>4.0</td><td>60%</td><td class=\"waste\">$16.87</td>" in alice_row.group(1)
    assert "vision/train-1" in html


def test_html_heatmap_has_a_cell_per_gpu_hour_and_marks_held_idle_hours(store_path: Path) -> None:
    html = render_html(_report(store_path), CostModel(COSTS))
    svg = html[html.index("<svg"): html.index("</svg>")]
    assert svg.count("<rect") == 3 * 168
    assert svg.count("<circle") == 4 + 6  # alice 08–12 on n1/gpu0, bob and carol 00–06 on n2/gpu0
    for label in ("n1/gpu0", "n1/gpu1", "n2/gpu0"):
        assert f">{label}</text>" in svg


def test_html_report_is_one_self_contained_file(store_path: Path) -> None:
    html = render_html(_report(store_path), CostModel(COSTS))
    assert "<script" not in html
    assert not re.search(r"""(src|href)\s*=""", html)
    assert "http" not in html.replace("http://www.w3.org/2000/svg", "")


def test_names_from_machines_are_escaped(tmp_path: Path) -> None:
    path = tmp_path / "u.sqlite"
    _fill(path, extra_pod="ns/<script>alert(1)</script>")
    html = render_html(_report(path), CostModel(COSTS))
    assert "<script>" not in html
    assert "ns/&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "n3&lt;b&gt;" in html and "mallory&lt;i&gt;@x" in html
    md = render_markdown(_report(path), CostModel(COSTS))
    assert "<script>" not in md


def test_markdown_report_has_team_and_owner_rows(store_path: Path) -> None:
    md = render_markdown(_report(store_path), CostModel(COSTS))
    assert "| **vision** | 8.0 | 4.0 | 60% | $16.87 |" in md
    assert "| carol@example.com | 0.0 | 3.0 | 1% | $3.60 | | |" in md
    assert "| **(no team)** |" in md


def test_team_filter_keeps_only_that_team(store_path: Path) -> None:
    r = _report(store_path, team="nlp")
    assert [t.team for t in r.teams] == ["nlp"]
    assert r.fleet.held_idle_cost == pytest.approx(HELD_BOB)
    assert [j.owner for j in r.top_idle_jobs] == ["bob@example.com"]


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command("report")(report_command)
    app.command("other")(lambda: None)  # a group, as in the real command line
    return app


def test_cli_writes_json_for_one_team(store_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"engine:\n  usage_db: {store_path}\ncosts:\n  energy_price_kwh: 0.5\n")
    monkeypatch.setattr("gpuevents.cli.report.SystemClock.now", lambda self: NOW)
    out = tmp_path / "r.json"
    result = CliRunner().invoke(_cli(), ["report", "--week", "--team", "vision", "--format", "json",
                                         "-o", str(out), "-c", str(cfg)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert [t["team"] for t in data["teams"]] == ["vision"]
    assert data["fleet"]["busy_h"] == pytest.approx(8.0)


def test_cli_says_where_usage_is_missing(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"engine:\n  usage_db: {tmp_path / 'none.sqlite'}\n")
    result = CliRunner().invoke(_cli(), ["report", "--week", "-c", str(cfg)])
    assert result.exit_code == 1
    assert "none.sqlite: no usage recorded yet" in result.output
