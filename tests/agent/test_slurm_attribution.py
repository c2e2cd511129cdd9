"""A real Slurm job's processes are attributed to the job by the agent (no call to slurmctld)."""

from __future__ import annotations

import pytest

from agent.attribution import PsutilIdentifier
from agent.host import UserDb
from tests.slurm_cluster import SlurmCluster
from tests.waiting import wait_for


async def test_a_slurm_jobs_process_carries_its_job_id(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    job = slurm.sbatch("sleep 300", "--gres=gpu:1")
    try:
        await wait_for(lambda: slurm.job_state(job) == "RUNNING", timeout=30, what="the job running")
        identifier = PsutilIdentifier(users=UserDb(None))

        def jobs_of_its_processes() -> set[str | None]:
            # right after the step starts, a pid may still be slurmstepd's fork, before the script's exec
            return {i.job for i in identifier.identify(slurm.job_pids(job)).values()}

        await wait_for(lambda: jobs_of_its_processes() == {job}, timeout=15, what="the job's processes attributed")
        outside = PsutilIdentifier(users=UserDb(None)).identify([1])  # not in any job
        assert all(i.job is None for i in outside.values())
    finally:
        slurm.run("scancel", job, check=False)
