"""deploy/slurm's prolog and epilog write and clear the HPC job mapping the agent reads (dcgm-exporter's format)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from agent.hpcjobs import JobMapping

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "slurm"


def run(script: str, job: str, gpus: str, directory: Path) -> None:
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": job, "SLURM_JOB_GPUS": gpus,
           "GPUEVENTS_JOB_MAP_DIR": str(directory)}
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
    assert sorted(p.name for p in d.iterdir()) == ["0"]
