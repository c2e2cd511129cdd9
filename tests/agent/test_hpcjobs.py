"""deploy/slurm's prolog and epilog write and clear the HPC job mapping the agent reads (dcgm-exporter's format)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from agent.hpcjobs import JobMapping
from agent.jobdetails import JobDirectory

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "slurm"


def run(script: str, job: str, gpus: str, directory: Path, **extra: str) -> None:
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": job, "SLURM_JOB_GPUS": gpus,
           "GPUEVENTS_JOB_MAP_DIR": str(directory), **extra}
    subprocess.run(["/bin/sh", str(DEPLOY / script)], env=env, check=True, timeout=10)


def test_prolog_maps_the_jobs_gpus_and_epilog_clears_them(tmp_path: Path) -> None:
    d = tmp_path / "map"
    run("prolog.sh", "101", "0,1", d)
    run("prolog.sh", "102", "1", d)  # GPU 1 shared by two jobs
    assert JobMapping(d).jobs() == {"0": ["101"], "1": ["101", "102"]}
    run("epilog.sh", "101", "0,1", d)
    assert JobMapping(d).jobs() == {"1": ["102"]}
    run("epilog.sh", "102", "1", d)
    assert JobMapping(d).jobs() == {}


def test_values_from_the_environment_that_are_not_ids_write_nothing(tmp_path: Path) -> None:
    d = tmp_path / "map"
    run("prolog.sh", "1; rm -rf /", "0", d)
    run("prolog.sh", "7", "../../etc/x,0", d)
    assert JobMapping(d).jobs() == {"0": ["7"]}
    assert sorted(p.name for p in d.iterdir()) == [".jobs", "0"]
    assert sorted(p.name for p in (d / ".jobs").iterdir()) == ["7"]


def test_prolog_writes_the_jobs_owner_and_details_beside_the_mapping_and_epilog_removes_them(tmp_path: Path) -> None:
    d = tmp_path / "map"
    before = time.time()
    run("prolog.sh", "42", "1", d, SLURM_JOB_USER="alice", SLURM_JOB_UID="1000", SLURM_JOB_ACCOUNT="physics",
        SLURM_JOB_PARTITION="gpu", SLURM_JOB_NAME="train-7")
    got = JobDirectory(d, squeue=None)
    got.observe({"42"})
    details = got.get("42")
    assert details is not None
    assert (details.user, details.uid, details.account, details.partition, details.name) == (
        "alice", 1000, "physics", "gpu", "train-7")
    assert details.started_at is not None and details.started_at.timestamp() >= int(before)
    run("epilog.sh", "42", "1", d)
    assert not (d / ".jobs" / "42").exists()


def test_a_value_with_shell_or_path_characters_is_left_empty_not_rewritten(tmp_path: Path) -> None:
    d = tmp_path / "map"
    run("prolog.sh", "43", "0", d, SLURM_JOB_USER="bob\nuser=root", SLURM_JOB_ACCOUNT="$(id)",
        SLURM_JOB_PARTITION="../../etc", SLURM_JOB_UID="0; rm")
    got = JobDirectory(d, squeue=None)
    got.observe({"43"})
    details = got.get("43")
    assert details is not None
    assert (details.user, details.uid, details.account, details.partition) == (None, None, None, None)
