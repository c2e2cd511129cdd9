"""`gpuevents rightsize` and `gpuevents report --weeks 13` on a simulated quarter: slices advised with savings, a
team's 13-week line against its target, a before/after comparison, and simulated usage said in every report."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuevents.cli import app

pytestmark = pytest.mark.slow  # the module simulates a quarter of usage through the CLI (`simulate --history 91d`)

NOW = datetime(2026, 4, 14, 10, 30, tzinfo=UTC)


@pytest.fixture(scope="module")
def quarter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config whose usage store holds 13 simulated weeks of two nodes."""
    tmp = tmp_path_factory.mktemp("quarter")
    cfg = tmp / "c.yaml"
    cfg.write_text(f"engine:\n  usage_db: {tmp / 'usage.sqlite'}\nteams:\n  nlp: {{target_util_pct: 60}}\n"
                   "costs:\n  models: {H100: {price: 30000, depreciation_years: 4, rated_power_w: 700}}\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("gpuevents.clock.SystemClock.now", lambda self: NOW)
        result = CliRunner().invoke(app, ["simulate", "--history", "91d", "--nodes", "2", "-c", str(cfg)])
    assert result.exit_code == 0, result.output
    return cfg


@pytest.fixture(autouse=True)
def _now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpuevents.clock.SystemClock.now", lambda self: NOW)


def test_rightsize_advises_slices_for_the_small_inference_servers_biggest_saving_first(quarter: Path) -> None:
    result = CliRunner().invoke(app, ["rightsize", "--since", "7d", "--json", "-c", str(quarter)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["simulated"] is True
    advised = [f for f in data["fits"] if f["fit"] in ("mig", "smaller_gpu", "share")]
    assert advised, data["fits"][:3]
    assert any(f["target"].startswith("MIG 1g.") for f in advised)  # the tritonservers use a few GB and % of SMs
    savings = [f["saving_per_week"] for f in advised]
    assert savings == sorted(savings, reverse=True) and savings[0] > 0
    for f in advised:  # never advised below what was measured
        if f["fit"] == "mig":
            gb = float(f["target"].split(".")[1].removesuffix("gb"))
            assert gb * 1000**3 / 1024**2 >= f["peak_mem_mib"] * 1.2
    busy = [f for f in data["fits"] if f["p95_util_pct"] and f["p95_util_pct"] >= 90 and f["held_gpu_h"] >= 1]
    assert busy and all(f["fit"] == "whole" for f in busy)


def test_rightsize_table_says_plainly_when_nothing_was_held(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"engine:\n  usage_db: {tmp_path / 'none.sqlite'}\n")
    result = CliRunner().invoke(app, ["rightsize", "-c", str(cfg)])
    assert result.exit_code == 1 and "no usage recorded yet" in result.output


def test_report_weeks_shows_each_teams_quarter_against_its_target(quarter: Path) -> None:
    result = CliRunner().invoke(app, ["report", "--weeks", "13", "--format", "json", "-c", str(quarter)])
    assert result.exit_code == 0, result.output
    q = json.loads(result.output)["quarter"]
    assert q["simulated"] is True and len(q["weeks"]) == 13
    nlp = next(t for t in q["teams"] if t["team"] == "nlp")
    assert nlp["target_util_pct"] == 60
    utils = [p["util_pct"] for p in nlp["points"] if p["util_pct"] is not None]
    assert len(utils) >= 12
    assert sum(utils[-3:]) / 3 > sum(utils[:3]) / 3 + 5  # the team improved over the quarter

    html = CliRunner().invoke(app, ["report", "--weeks", "13", "-c", str(quarter)]).output
    assert "target 60 %" in html and "<svg" in html and "simulated" in html.lower()
    md = CliRunner().invoke(app, ["report", "--weeks", "13", "--format", "md", "-c", str(quarter)]).output
    assert "| nlp |" in md and " → " in md and "in 13 weeks" in md
    markdown = CliRunner().invoke(app, ["report", "--weeks", "13", "--format", "markdown", "-c", str(quarter)])
    assert markdown.exit_code == 0 and markdown.output == md  # markdown is md's long name here too


def test_report_compares_a_period_before_with_the_weeks_after(quarter: Path) -> None:
    result = CliRunner().invoke(app, ["report", "--since", "2026-03-16", "--until", "2026-04-12", "--compare",
                                      "2026-01-19..2026-02-15", "--format", "json", "-c", str(quarter)])
    assert result.exit_code == 0, result.output
    c = json.loads(result.output)["comparison"]
    fleet_before, fleet_after = c["rows"][0]
    assert fleet_before["team"] is None and fleet_before["gpu_h"] > 0 and fleet_after["gpu_h"] > 0
    nlp_before, nlp_after = next(r for r in c["rows"] if r[0]["team"] == "nlp")
    assert nlp_after["util_pct"] > nlp_before["util_pct"]


def test_a_bad_period_says_how_to_write_one(quarter: Path) -> None:
    result = CliRunner().invoke(app, ["report", "--compare", "last september", "-c", str(quarter)])
    assert result.exit_code == 2 and "START..END" in result.output


def test_the_weekly_report_has_the_quarter_line_the_right_sizing_and_says_it_is_simulated(quarter: Path) -> None:
    report = json.loads(CliRunner().invoke(app, ["report", "--format", "json", "-c", str(quarter)]).output)
    assert report["simulated"] is True
    nlp = next(k for k in report["kpi"] if k["team"] == "nlp")
    assert "in 13 weeks (target 60 %)" in nlp["text"]
    assert report["rightsize"] and report["rightsize"][0]["saving_per_week"] > 0


def test_rightsize_says_plainly_when_it_has_too_little_data_to_advise(tmp_path: Path) -> None:
    from rules.usage.fits import FitAmounts, FitKey
    from rules.usage.store import UsageStore

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"engine:\n  usage_db: {tmp_path / 'u.sqlite'}\n")
    hour = int(NOW.timestamp()) // 3600 * 3600
    hist = [0.0] * 20
    hist[1] = 600
    with UsageStore(tmp_path / "u.sqlite") as store:  # ten minutes of one job: not enough to size it
        store.add_fits([(FitKey(hour, "c", "job/slurm/7"), FitAmounts(
            owner="alice", team="nlp", model="NVIDIA H100 80GB HBM3", gpus=1, held_s=600, peak_mem_mib=2000,
            mem_total_mib=81_559, util_hist=hist))])
    result = CliRunner().invoke(app, ["rightsize", "-c", str(cfg)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "0 of 1 would fit smaller" in result.output
    assert "Too little data to advise: each of the 1 workload(s) seen in the last 7d" in result.output


def test_simulated_history_writes_job_summaries_with_p95_and_fits_marked_simulated(quarter: Path) -> None:
    result = CliRunner().invoke(app, ["jobs", "--since", "14d", "--json", "-c", str(quarter)])
    assert result.exit_code == 0, result.output
    jobs = json.loads(result.output)
    slurm = [j for j in jobs if j["scheduler"] == "slurm"]
    assert slurm and all(j["simulated"] and not j["running"] for j in jobs)
    fitted = [j for j in slurm if j["smaller_fit"]]
    assert fitted and all(j["smaller_fit"].startswith("MIG ") for j in fitted)
    for j in slurm:
        if j["p95_util_pct"] is not None:
            assert j["p95_util_pct"] <= j["peak_util_pct"] and j["p95_mem_mib"] <= j["peak_mem_mib"]
    # somewhere a spike above the job's p95 (a stall, noise): the p95 is what right-sizing reads
    assert any(j["p95_util_pct"] is not None and j["p95_util_pct"] < j["peak_util_pct"] for j in slurm)

    table = CliRunner().invoke(app, ["jobs", "--since", "14d", "-c", str(quarter)]).output
    assert table.startswith("Includes simulated jobs (gpuevents simulate --history): marked *.")
    one = CliRunner().invoke(app, ["job", fitted[0]["id"], "-c", str(quarter)]).output
    assert "[SIMULATED: written by gpuevents simulate --history]" in one and " p95 " in one
    assert f"smaller fit {fitted[0]['smaller_fit']}" in one


def test_rightsize_by_owner_adds_each_users_savings_up(quarter: Path) -> None:
    per_job = json.loads(CliRunner().invoke(app, ["rightsize", "--json", "-c", str(quarter)]).output)["fits"]
    result = CliRunner().invoke(app, ["rightsize", "--by-owner", "--json", "-c", str(quarter)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["simulated"] is True
    owners = data["owners"]
    assert [o["saving_per_week"] for o in owners] == sorted((o["saving_per_week"] for o in owners), reverse=True)
    for o in owners:
        mine = [f for f in per_job if (f["owner"] or "unknown") == o["owner"]]
        assert o["workloads"] == len(mine)
        assert o["saving_per_week"] == pytest.approx(sum(f["saving_per_week"] for f in mine), abs=0.05)
