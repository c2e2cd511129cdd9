"""`gpuevents job` and `gpuevents jobs`: summaries from the usage store, as text and JSON; bad input says so."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from typer.testing import CliRunner

from gpuevents.cli import app
from rules.usage.recorder import UsageRecorder
from tests.rules.usage.test_jobledger import job, snap
from tests.rules.usage.test_jobstore import config, write_config


async def test_jobs_lists_a_users_jobs_of_a_window(tmp_path: Path) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    rec = UsageRecorder.from_config(config(tmp_path))
    for m in range(3):
        at = now - timedelta(minutes=10 - m)
        rec.observe(snap("n1", at, [90], [job([0])]), at)
    await rec.flush(now)
    rec.close()
    cfg = str(write_config(tmp_path))
    mine = CliRunner().invoke(app, ["jobs", "--user", "alice", "--since", "1h", "-c", cfg])
    assert mine.exit_code == 0 and "42" in mine.output and "running" in mine.output
    others = CliRunner().invoke(app, ["jobs", "--user", "bob", "-c", cfg, "--json"])
    assert others.exit_code == 0 and json.loads(others.output) == []
    bad = CliRunner().invoke(app, ["jobs", "--since", "a week", "-c", cfg])
    assert bad.exit_code == 2 and "--since: must be a duration" in bad.output


async def test_the_same_job_id_at_two_sites_is_two_jobs_named_by_cluster(tmp_path: Path) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    rec = UsageRecorder.from_config(config(tmp_path))
    for m in range(3):
        at = now - timedelta(minutes=10 - m)
        rec.observe(snap("n1", at, [90], [job([0])]), at)  # the config's own cluster: default
        other = snap("n1", at, [10], [job([0])]).model_copy(update={"cluster": "site-b"})
        rec.observe(other, at)
    await rec.flush(now)
    rec.close()
    cfg = str(write_config(tmp_path))
    own = CliRunner().invoke(app, ["job", "42", "--json", "-c", cfg])
    assert own.exit_code == 0 and [j["cluster"] for j in json.loads(own.output)] == ["default"]
    b = CliRunner().invoke(app, ["job", "42", "--cluster", "site-b", "--json", "-c", cfg])
    assert b.exit_code == 0 and [j["cluster"] for j in json.loads(b.output)] == ["site-b"]
    assert json.loads(b.output)[0]["mean_util_pct"] < json.loads(own.output)[0]["mean_util_pct"]
    none = CliRunner().invoke(app, ["job", "42", "--cluster", "site-c", "-c", cfg])
    assert none.exit_code == 1 and "seen in default, site-b: add --cluster" in none.output


def test_a_job_never_seen_and_a_missing_store_are_said_plainly(tmp_path: Path) -> None:
    cfg = str(write_config(tmp_path))
    missing = CliRunner().invoke(app, ["job", "42", "-c", cfg])
    assert missing.exit_code == 1 and "no usage recorded yet" in missing.output
    UsageRecorder.from_config(config(tmp_path)).close()
    unknown = CliRunner().invoke(app, ["job", "42", "-c", cfg])
    assert unknown.exit_code == 1 and "job 42: no summary" in unknown.output
