"""Slurm's accounting as job summaries, from `sacct --parsable2` output as its manual documents it (no slurmdbd
runs here): GPUs from AllocTRES, times in UTC, node lists expanded, jobstats' summaries read where present; the
import writes imported jobs, leaves live ones alone, and gives the same store when repeated."""

from __future__ import annotations

import base64
import gzip
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuevents.config import Config
from gpuevents.costs import CostModel
from rules.history.sacct import SacctError, gpus_of, hosts, jobstats_of, parse, tally_of
from rules.history.slurmimport import SacctFailed, import_slurm, run_sacct
from rules.usage.jobledger import JobTally
from rules.usage.jobstore import JobStore


def js1(summary: dict[str, object]) -> str:
    """An AdminComment as jobstats' slurmctld epilog writes it: `JS1:` and base64 of the gzipped JSON."""
    return "JS1:" + base64.b64encode(gzip.compress(json.dumps(summary).encode())).decode()


STATS = {"gpus": 2, "nodes": {"gpu01": {"gpu_utilization": {"0": 92.5, "1": 3.0},
                                        "gpu_used_memory": {"0": 40 * 2**30, "1": 2**30},
                                        "gpu_total_memory": {"0": 80 * 2**30, "1": 80 * 2**30}}},
         "total_time": 7200}
OUTPUT = "\n".join([
    # JobID|JobName|User|Account|Partition|QOS|AllocTRES|Start|End|State|NodeList|AdminComment
    f"1001|train|alice|nlp|gpu|normal|billing=16,cpu=16,gres/gpu:a100=2,gres/gpu=2,mem=128G,node=1|"
    f"2026-11-02T08:00:00|2026-11-02T10:00:00|COMPLETED|gpu01|{js1(STATS)}",
    "1002|notebook|bob|vision|gpu|normal|cpu=4,gres/gpu:h100=1,mem=32G,node=1|2026-11-02T09:00:00|"
    "2026-11-02T13:30:00|CANCELLED by 1234|gpu[02-03]|",
    "1003|build|carol|infra|cpu|normal|cpu=8,mem=16G,node=1|2026-11-02T09:00:00|2026-11-02T09:30:00|COMPLETED|"
    "cpu07|",
    "1004|sweep|dave|nlp|gpu|normal|cpu=8,gres/gpu=4,node=1|2026-11-02T12:00:00|Unknown|RUNNING|gpu04|",
    "1005|waiting|erin|nlp|gpu|normal||Unknown|Unknown|PENDING|None assigned|",
]) + "\n"


def config(tmp_path: Path) -> Config:
    return Config.model_validate({"cluster": "hpc", "engine": {"usage_db": str(tmp_path / "usage.sqlite")}})


def test_gpus_come_from_alloc_tres_and_node_lists_are_expanded() -> None:
    assert gpus_of("billing=16,cpu=16,gres/gpu:a100=2,gres/gpu=2,mem=128G,node=1") == 2
    assert gpus_of("cpu=4,gres/gpu:h100=1,gres/gpu:a100=2") == 3
    assert gpus_of("cpu=8,mem=16G") == 0
    assert hosts("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert hosts("None assigned") == []


def test_sacct_lines_become_jobs_with_jobstats_where_its_epilog_stored_them() -> None:
    jobs = {j.id: j for j in parse(OUTPUT)}
    assert jobs["1001"].gpus == 2 and jobs["1001"].start == datetime(2026, 11, 2, 8, tzinfo=UTC)
    assert jobs["1001"].jobstats == STATS
    assert jobs["1002"].state == "CANCELLED" and jobs["1002"].nodes == ["gpu02", "gpu03"]
    assert jobs["1002"].jobstats is None and jobs["1004"].end is None
    assert jobstats_of("JS1:Short") is None and jobstats_of("JS1:H4sIbroken") is None


def test_a_line_that_is_not_sacct_output_is_said_with_its_number() -> None:
    with pytest.raises(SacctError, match="sacct output line 2: 3 fields"):
        parse(OUTPUT.splitlines()[0] + "\n1|2|3\n")


def test_a_job_with_jobstats_has_its_utilisation_and_one_without_only_its_allocation() -> None:
    jobs = {j.id: j for j in parse(OUTPUT)}
    with_stats = tally_of(jobs["1001"], "hpc")
    assert with_stats is not None and with_stats.gpu_s == 2 * 7200 and with_stats.imported
    assert with_stats.util_s / with_stats.util_known_s == pytest.approx((92.5 + 3.0) / 2)
    assert with_stats.mem_peak_mib == 40 * 1024
    alloc_only = tally_of(jobs["1002"], "hpc")
    assert alloc_only is not None and alloc_only.gpu_s == 4.5 * 3600 and alloc_only.util_known_s == 0
    assert tally_of(jobs["1003"], "hpc") is None  # no GPU
    assert tally_of(jobs["1004"], "hpc") is None  # running: the engine counts it live


def test_the_import_writes_imported_jobs_says_what_it_left_out_and_repeats_to_the_same_store(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    first = import_slurm(cfg, OUTPUT)
    assert (first.jobs, first.gpu_jobs, first.written, first.with_jobstats, first.running) == (5, 2, 2, 1, 1)
    said = " ".join(first.lines(datetime(2026, 11, 2, tzinfo=UTC), datetime(2026, 11, 3, tzinfo=UTC)))
    assert "1 jobs without jobstats data: allocations only" in said and "1 GPU jobs still running" in said
    with JobStore(cfg.engine.usage_db) as store:
        once = store.window(0)
    import_slurm(cfg, OUTPUT)
    with JobStore(cfg.engine.usage_db) as store:
        assert store.window(0) == once
        found = {s.id: s for s in once}
    assert found["1001"].imported and found["1001"].mean_util_pct == pytest.approx(47.8, abs=0.1)
    assert found["1002"].mean_util_pct is None and found["1002"].gpu_hours == 4.5


def test_a_job_the_engine_saw_live_is_left_as_it_was(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    seen = datetime(2026, 11, 2, 8, tzinfo=UTC)
    live = JobTally(cluster="hpc", scheduler="slurm", id="1001", first_seen=seen, last_seen=seen, gpu_count=2,
                    gpu_s=123.0, ended_at=seen)
    with JobStore(cfg.engine.usage_db) as store:
        store.put([live], CostModel(cfg.costs))
    assert import_slurm(cfg, OUTPUT).written == 1
    with JobStore(cfg.engine.usage_db) as store:
        (kept,) = store.find("1001")
    assert not kept.imported and kept.gpu_hours == round(123 / 3600, 3)


def test_a_sacct_without_slurmdbd_is_said_in_one_line() -> None:
    with pytest.raises(SacctFailed, match=r"sacct exited 1: "):
        run_sacct("sacct", datetime(2026, 11, 2, tzinfo=UTC), datetime(2026, 11, 3, tzinfo=UTC))
    with pytest.raises(SacctFailed, match="not found; install Slurm's client or pass --sacct PATH"):
        run_sacct("/nonexistent/sacct", datetime(2026, 11, 2, tzinfo=UTC), datetime(2026, 11, 3, tzinfo=UTC))


def test_the_jobs_listing_marks_imported_jobs(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpuevents.cli import app

    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"cluster: hpc\nengine: {{usage_db: {tmp_path / 'usage.sqlite'}}}\n")
    import_slurm(config(tmp_path), OUTPUT.replace("2026-11-02", f"{datetime.now(UTC):%Y-%m-%d}"))
    listing = CliRunner().invoke(app, ["jobs", "--since", "2d", "-c", str(cfg)])
    assert listing.exit_code == 0, listing.output
    assert "imported from the site's history (gpuevents import): marked +" in listing.output
    assert "ended +" in listing.output
    one = CliRunner().invoke(app, ["job", "1002", "-c", str(cfg)])
    assert "[imported from the site's history: gpuevents import]" in one.output
