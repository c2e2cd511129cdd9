"""Job summaries in the usage store: written as jobs run and end, kept across an engine restart, added to a
store from before they existed, and read back by `gpuevents job` / `gpuevents jobs`."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

from typer.testing import CliRunner

from gpuevents.cli import app
from gpuevents.config import Config, CostsConfig
from gpuevents.costs import CostModel
from gpuevents.events import JobInfo
from rules.usage.recorder import UsageRecorder
from rules.usage.store import UsageStore
from tests.rules.usage.test_jobledger import job, snap

COSTS = CostModel(CostsConfig())


def config(tmp_path: Path) -> Config:
    return Config.model_validate({"engine": {"usage_db": str(tmp_path / "usage.sqlite")},
                                  "agent": {"snapshot_interval": "1m"}})


async def test_a_running_job_survives_a_restart_and_its_summary_is_complete_when_it_ends(tmp_path: Path) -> None:
    now = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    rec = UsageRecorder.from_config(config(tmp_path))
    for m in range(31):  # 30 minutes at 20 %
        at = now + timedelta(minutes=m)
        rec.observe(snap("n1", at, [20, 20], [job([0, 1], name="train")], mem=30000), at)
    await rec.flush(now + timedelta(minutes=30))
    rec.close()

    rec = UsageRecorder.from_config(config(tmp_path))  # the engine restarts
    assert [t.id for t in rec.ledger.jobs.values()] == ["42"]
    for m in range(31, 61):  # another 30 minutes, idle
        at = now + timedelta(minutes=m)
        rec.observe(snap("n1", at, [0, 0], [job([0, 1], name="train")]), at)
    end = now + timedelta(minutes=61)
    rec.observe(snap("n1", end, [0, 0], []), end)
    await rec.flush(end)
    rec.close()

    result = CliRunner().invoke(app, ["job", "42", "--json", "-c", str(write_config(tmp_path))])
    assert result.exit_code == 0, result.output
    [s] = json.loads(result.output)
    assert s["running"] is False and s["user"] == "alice" and s["partition"] == "gpu" and s["name"] == "train"
    assert s["gpu_count"] == 2
    # the minute across the restart is not counted (no sample of it in the new engine)
    assert s["gpu_hours"] == 2.0
    assert s["mean_util_pct"] == 10  # 20 % for half its time, 0 % for the other half
    assert s["peak_util_pct"] == 20 and s["peak_mem_mib"] == 30000
    assert s["idle_share_pct"] == 50
    assert s["mean_sm_active_pct"] is None  # not measured
    # peak 30,000 MiB + 20 % and peak 20 % + 20 % of the SMs: 3 of the H100's 7 slices, 40 GB
    assert s["smaller_fit"] == "MIG 3g.40gb"
    assert s["cost"] > 0

    text = CliRunner().invoke(app, ["job", "42", "-c", str(write_config(tmp_path))])
    assert "Job 42 (slurm, train): ended" in text.output and "of 2 GPU(s)" in text.output
    assert "MIG 3g.40gb" in text.output


def test_a_store_from_before_job_summaries_gains_the_table_and_keeps_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "usage.sqlite"
    with UsageStore(db) as store:
        assert store.usage(0, 2**40) == []
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE IF EXISTS job_summaries")  # as an older engine left it
    conn.execute("INSERT INTO usage (hour, cluster, node, gpu, owner, team) VALUES (3600, 'c', 'n', 0, 'a', 't')")
    conn.commit()
    conn.close()
    rec = UsageRecorder.from_config(config(tmp_path))
    rec.close()
    with UsageStore(db) as store:
        assert len(store.usage(0, 2**40)) == 1
    tables = {r[0] for r in sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"usage", "idle_jobs", "job_summaries"} <= tables


def write_config(tmp_path: Path) -> Path:
    p = tmp_path / "config.yaml"
    p.write_text(f"engine: {{usage_db: {tmp_path / 'usage.sqlite'}}}\n")
    return p


async def test_a_job_exempt_by_annotation_is_in_the_weekly_report_with_its_end(tmp_path: Path) -> None:
    now = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)
    until = (now + timedelta(days=2)).isoformat().replace("+00:00", "Z")
    kept = JobInfo(id="team-a/Deployment/chat", scheduler="kubernetes", user="carol", namespace="team-a", gpus=[0],
                   annotations={"gpuevents.io/keep-until": until})
    sloppy = JobInfo(id="team-a/Deployment/notebook", scheduler="kubernetes", user="dave", namespace="team-a",
                     gpus=[1], annotations={"gpuevents.io/exclude": "forever"})
    rec = UsageRecorder.from_config(config(tmp_path))
    for m in range(61):
        at = now + timedelta(minutes=m)
        rec.observe(snap("n1", at, [0, 0], [kept, sloppy]), at)
    await rec.flush(now + timedelta(minutes=60))
    rec.close()

    report = json.loads(CliRunner().invoke(app, ["report", "--format", "json", "-c",
                                                 str(write_config(tmp_path))]).output)
    lines = {x["job"]: x for x in report["exemptions"]}
    chat = lines["job/kubernetes/team-a/Deployment/chat"]
    assert chat["exemption"] == f"gpuevents.io/keep-until: {until}" and chat["user"] == "carol"
    assert datetime.fromisoformat(chat["until"]) == datetime.fromisoformat(until.replace("Z", "+00:00"))
    assert chat["idle_share_pct"] == 100 and chat["gpu_hours"] == 1.0
    notebook = lines["job/kubernetes/team-a/Deployment/notebook"]
    assert notebook["exemption"].startswith("malformed gpuevents.io/exclude") and notebook["until"] is None
    md = CliRunner().invoke(app, ["report", "--format", "md", "-c", str(write_config(tmp_path))]).output
    assert "## Exempt by annotation" in md and "keep-until" in md
