"""`gpuevents import --from prometheus` against a real Prometheus backfilled with two weeks of generated
dcgm-exporter series (every state, MIG instances, Kubernetes labels): the report of the window gives the fleet's
GPU-hours by state within 5 % of the truth they were generated from, marked imported and not simulated; importing
again gives the same store; the jobs, right-sizing and the weekly heatmap read the imported hours."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuevents.cli import app
from rules.history.dcgm import METRICS
from tests.dcgm_series import PHYSICAL_GPUS, Gpu, Segment, truth, write
from tests.flaky_http import flaky
from tests.prometheus import PrometheusServer

DAY = 86400
STEP = 120


@dataclass
class History:
    prometheus: PrometheusServer
    segments: dict[Gpu, list[Segment]]
    since: datetime
    until: datetime


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    root = tmp_path_factory.mktemp("dcgm-history")
    until = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
    since = until - timedelta(days=14)
    segments = write(root / "dcgm.om", int(since.timestamp()), int(until.timestamp()), STEP)
    with PrometheusServer.backfilled(root / "prometheus", root / "dcgm.om") as server:
        yield History(server, segments, since, until)


def write_config(tmp_path: Path) -> str:
    p = tmp_path / "config.yaml"
    p.write_text(f"cluster: c0\nengine: {{usage_db: {tmp_path / 'usage.sqlite'}}}\n"
                 "agent: {attribution: {owner_pod_label: owner}}\n")
    return str(p)


def day(d: datetime) -> str:
    return f"{d:%Y-%m-%d}"


def run_import(url: str, cfg: str, since: datetime, until: datetime, *more: str) -> str:
    last = until - timedelta(days=1)  # a date names its whole day
    result = CliRunner().invoke(app, ["import", "--from", "prometheus", "--url", url, "--since", day(since),
                                      "--until", day(last), "--step", f"{STEP}s", "--chunk", "24h", "--pace", "0s",
                                      "-c", cfg, *more])
    assert result.exit_code == 0, result.output
    return result.output


def test_a_held_out_import_reports_each_state_within_5_percent_of_the_truth(history: History,
                                                                         tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    said = run_import(history.prometheus.url, cfg, history.since, history.until)
    assert "imported 672 node-hours of 7 GPUs on 2 nodes" in said and "marked imported, not simulated" in said
    last = history.until - timedelta(days=1)
    report = CliRunner().invoke(app, ["report", "--since", day(history.since), "--until", day(last),
                                      "--format", "json", "-c", cfg])
    assert report.exit_code == 0, report.output
    data = json.loads(report.output)
    want = truth(history.segments, int(history.since.timestamp()), int(history.until.timestamp()))
    assert want["gpu_h"] == pytest.approx(14 * 24 * PHYSICAL_GPUS)
    for key in ("gpu_h", "busy_h", "held_idle_h", "unallocated_h"):
        assert data["fleet"][key] == pytest.approx(want[key], rel=0.05), key
    assert data["simulated"] is False and data["imported"] is True
    assert len(data["quarter"]["weeks"]) == 2 and all(p["gpu_h"] == pytest.approx(7 * 24 * PHYSICAL_GPUS, rel=0.01)
                                                      for p in data["quarter"]["fleet"]["points"])
    mid = history.since + timedelta(days=7)
    compare = CliRunner().invoke(app, ["report", "--since", day(mid), "--until", day(last), "--compare",
                                       f"{day(history.since)}..{day(mid - timedelta(days=1))}", "--format", "md",
                                       "-c", cfg])
    assert compare.exit_code == 0, compare.output
    assert "## Before and after" in compare.output and "imported from the site's history" in compare.output
    assert "simulated" not in compare.output


def test_importing_a_window_again_gives_the_same_store(history: History, tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    since, until = history.until - timedelta(days=2), history.until
    run_import(history.prometheus.url, cfg, since, until)
    first = dump(tmp_path / "usage.sqlite")
    assert "2 chunks imported before" in run_import(history.prometheus.url, cfg, since, until)
    again = run_import(history.prometheus.url, cfg, since, until, "--again")
    assert "imported 96 node-hours" in again
    assert dump(tmp_path / "usage.sqlite") == first


def test_jobs_rightsizing_and_the_heatmap_read_imported_hours(history: History, tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    run_import(history.prometheus.url, cfg, history.until - timedelta(days=3), history.until)
    jobs = CliRunner().invoke(app, ["jobs", "--since", "30d", "--json", "-c", cfg])
    assert jobs.exit_code == 0, jobs.output
    found = json.loads(jobs.output)
    assert found and all(j["imported"] and j["scheduler"] == "kubernetes" for j in found)
    assert {j["namespace"] for j in found} <= {"nlp", "vision"}
    fits = CliRunner().invoke(app, ["rightsize", "--since", "30d", "--json", "-c", cfg])
    assert fits.exit_code == 0, fits.output
    assert json.loads(fits.output)["fits"]
    week = CliRunner().invoke(app, ["report", "--format", "json", "-c", cfg])
    assert week.exit_code == 0, week.output
    data = json.loads(week.output)
    # owners and teams as the agent finds them: the pods' `owner` and `team` labels, from kube_pod_labels
    teams = {t["team"] for t in data["teams"]}
    assert "language" in teams and teams <= {"language", "vision", ""}  # nlp's pods are team language
    assert {o["owner"] for t in data["teams"] for o in t["owners"]} - {"unknown"} <= {"alice", "bob", "carol"}
    heatmap = data["heatmap"]
    labels = {r["label"] for r in heatmap["rows"]}
    assert {"dgx-a/gpu0", "dgx-b/gpu101", "dgx-b/gpu1"} <= labels  # a MIG instance: 100 × (GPU + 1) + its id
    assert any(c is not None for r in heatmap["rows"] for c in r["cells"])


def dump(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as db:
        return [*db.execute("SELECT * FROM usage ORDER BY 1, 2, 3, 4, 5, 6"),
                *db.execute("SELECT * FROM idle_jobs ORDER BY 1, 2, 3, 4, 5"),
                *db.execute("SELECT * FROM fits ORDER BY 1, 2, 3"),
                *db.execute("SELECT hour, cluster, node, origin FROM origins ORDER BY 1, 2, 3"),
                *db.execute("SELECT * FROM job_summaries ORDER BY 1, 2, 3")]


def test_a_prometheus_that_fails_and_times_out_part_way_is_retried_to_the_same_store(history: History,
                                                                                    tmp_path: Path) -> None:
    since, until = history.until - timedelta(days=1), history.until
    direct = tmp_path / "direct"
    direct.mkdir()
    run_import(history.prometheus.url, write_config(direct), since, until)
    plan = {2: "503", 3: "503", 6: "hang", 9: "503"}
    with flaky(history.prometheus.url, lambda n: plan.get(n, "pass")) as (url, seen):
        said = run_import(url, write_config(tmp_path), since, until, "--timeout", "1s")
    assert seen.count("503") == 3 and seen.count("hang") == 1
    assert "(4 requests retried after an error or timeout)" in said
    assert dump(tmp_path / "usage.sqlite") == dump(direct / "usage.sqlite")


def test_an_import_stopped_by_prometheus_goes_on_where_it_stopped(history: History, tmp_path: Path) -> None:
    since, until = history.until - timedelta(days=2), history.until
    cfg = write_config(tmp_path)
    first_chunk = len(METRICS) + 1  # its series, and its pods' labels
    with flaky(history.prometheus.url, lambda n: "pass" if n <= first_chunk else "503") as (url, _seen):
        result = CliRunner().invoke(app, ["import", "--from", "prometheus", "--url", url, "--since", day(since),
                                          "--until", day(until - timedelta(days=1)), "--step", f"{STEP}s",
                                          "--chunk", "24h", "--pace", "0s", "--retries", "1", "-c", cfg])
    assert result.exit_code == 1
    assert "HTTP 503" in result.output and "run the same command again" in result.output
    assert "Traceback" not in result.output
    said = run_import(history.prometheus.url, cfg, since, until)
    assert "1 chunks imported before" in said and "imported 48 node-hours" in said


def test_a_backtest_replays_readings_rebuilt_from_the_series(history: History, tmp_path: Path) -> None:
    rules = tmp_path / "held.yaml"
    rules.write_text("""rules:
  - name: held-idle-2h
    entity: gpu
    when: gpu.idle and gpu.allocated
    for: 2h
    actions:
      - type: slack
        to: "#gpus"
        text: "GPU {{ gpu.index }} on {{ node.name }} held idle for two hours"
""")
    result = CliRunner().invoke(app, ["rules", "backtest", str(rules), "--since", "3d", "--prometheus",
                                      history.prometheus.url, "--step", f"{STEP}s", "--json",
                                      "-c", write_config(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    # each stretch held idle for over two hours inside the replayed days fires on its GPU
    start = datetime.fromisoformat(report["start"]).timestamp()
    stretches = [(g.node, f"gpu{g.index}") for g, segs in history.segments.items() for a, b in held_idle(segs)
                 if a >= start and b - a > 2 * 3600 + STEP]
    fired = {tuple(i["entity_id"].split("/")[-2:]) for i in report["incidents"]}
    assert stretches and set(stretches) <= fired
    assert report["rules"][0]["fired"] >= len(stretches)
    assert "no processes" in report["note"]


def held_idle(segments: list[Segment]) -> list[tuple[int, int]]:
    """The stretches a GPU was held idle (by a pod, or by memory in use), adjoining segments joined."""
    out: list[tuple[int, int]] = []
    for s in segments:
        if s.state not in ("pod_idle", "mem_idle"):
            continue
        if out and out[-1][1] == s.start:
            out[-1] = (out[-1][0], s.end)
        else:
            out.append((s.start, s.end))
    return out
