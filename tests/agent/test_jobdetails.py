"""A Slurm job's details: the prolog's file, then squeue once per job; bad answers leave fields None."""

from __future__ import annotations

import logging
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.jobdetails import JobDirectory, parse_squeue_line, parse_time_limit


def script(tmp_path: Path, body: str) -> Path:
    """A stand-in squeue: a real executable that counts its calls in `calls`."""
    p = tmp_path / "squeue"
    p.write_text(f"#!/bin/sh\necho x >> {tmp_path / 'calls'}\n{body}\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return p


def calls(tmp_path: Path) -> int:
    f = tmp_path / "calls"
    return len(f.read_text().splitlines()) if f.exists() else 0


def test_time_limits_in_slurms_formats() -> None:
    assert parse_time_limit("1:30:00") == 5400
    assert parse_time_limit("2-00:00:00") == 172800
    assert parse_time_limit("5:00") == 300
    assert parse_time_limit("UNLIMITED") is None
    assert parse_time_limit("soon") is None


def test_a_job_name_that_looks_like_fields_stays_the_name() -> None:
    line = "7|alice|physics|gpu|normal|1:00:00|2026-12-03T10:00:00|x UserId=root(0) Partition=protected|a|b\n"
    d = parse_squeue_line("7", line)
    assert (d.user, d.partition, d.qos, d.time_limit_s) == ("alice", "gpu", "normal", 3600)
    assert d.name == "x UserId=root(0) Partition=protected|a|b"


def test_a_line_for_another_job_is_refused() -> None:
    with pytest.raises(ValueError, match="not a line for job 7"):
        parse_squeue_line("7", "8|alice|a|p|q|1:00|N/A|n\n")


async def test_squeue_fills_what_the_file_lacks_once_per_job(tmp_path: Path) -> None:
    (tmp_path / "map" / ".jobs").mkdir(parents=True)
    (tmp_path / "map" / ".jobs" / "7").write_text("user=alice\npartition=gpu\nstarted_at=1796300000\n")
    sq = script(tmp_path, 'echo "7|mallory|physics|other|high|2:00:00|2026-12-03T10:00:00|train"')
    jobs = JobDirectory(tmp_path / "map", squeue=sq)
    jobs.observe({"7"})
    await jobs.lookup_missing()
    await jobs.lookup_missing()
    d = jobs.get("7")
    assert d is not None
    assert (d.user, d.partition) == ("alice", "gpu")  # the prolog's word is kept
    assert (d.account, d.qos, d.time_limit_s, d.name) == ("physics", "high", 7200, "train")
    assert d.started_at == datetime.fromtimestamp(1796300000, UTC)
    assert calls(tmp_path) == 1
    assert jobs.failures == 0


@pytest.mark.parametrize("body, why", [
    ("echo 'garbage with no bars'", "not a line for job 9"),
    ("echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1", "Invalid job id"),
    ("exec sleep 30", "did not answer within 0.3s"),
])
async def test_a_failing_squeue_leaves_the_fields_unknown_counted_and_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, body: str, why: str) -> None:
    jobs = JobDirectory(tmp_path / "map", squeue=script(tmp_path, body), timeout_s=0.3)
    jobs.observe({"9"})
    with caplog.at_level(logging.WARNING, logger="agent.jobdetails"):
        await jobs.lookup_missing()
        await jobs.lookup_missing()  # asked once: a failing job is not asked again every second
    d = jobs.get("9")
    assert d is not None and d.user is None and d.qos is None
    assert jobs.failures == 1
    assert [r.getMessage() for r in caplog.records if why in r.getMessage()] != []
    assert len(caplog.records) == 1


async def test_a_missing_squeue_is_counted_and_the_job_keeps_its_files_details(tmp_path: Path) -> None:
    (tmp_path / "map" / ".jobs").mkdir(parents=True)
    (tmp_path / "map" / ".jobs" / "5").write_text("user=carol\n")
    jobs = JobDirectory(tmp_path / "map", squeue=tmp_path / "no-such-squeue")
    jobs.observe({"5"})
    await jobs.lookup_missing()
    d = jobs.get("5")
    assert d is not None and d.user == "carol" and d.time_limit_s is None
    assert jobs.failures == 1


def test_a_job_that_left_the_mapping_is_forgotten(tmp_path: Path) -> None:
    jobs = JobDirectory(tmp_path / "map", squeue=None)
    jobs.observe({"5", "6"})
    jobs.observe({"6"})
    assert jobs.get("5") is None and jobs.get("6") is not None
