"""`cancel` and `cordon` with a real Slurm (slurmctld + slurmd + munged on loopback, fake GPUs)."""

from __future__ import annotations

import time

import pytest

from actions.evidence import CONTRADICTED
from actions.runner import ActionRunner
from gpuevents.records import ActionRequest
from tests.actions.conftest import make_config, make_request
from tests.slurm_cluster import SlurmCluster
from tests.waiting import wait_for


@pytest.fixture
def slurm_env(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))  # the action's scancel/scontrol talk to this cluster
    return slurm


async def runner(**protect: object) -> ActionRunner:
    return await ActionRunner.open(None, make_config(protect={"users": [], **protect}))


async def running(slurm: SlurmCluster, *options: str) -> str:
    job = slurm.sbatch("sleep 300", "--gres=gpu:1", *options)
    await wait_for(lambda: slurm.job_state(job) == "RUNNING", timeout=30, what=f"job {job} running")
    return job


def cancel_request(node: str, job: str, user: str = "root", **params: object) -> ActionRequest:
    """A cancel decided on what `node` reported: pid 7 of `user` there runs in `job`."""
    return make_request("cancel", {"job": job, **params}, entity_kind="process", entity_id=f"{node}/pid7",
                        node=node, facts={"process": {"pid": 7, "user": user, "name": "python", "job": job}})


async def test_cancel_ends_a_real_job_and_squeue_shows_it_gone(slurm_env: SlurmCluster) -> None:
    job = await running(slurm_env)
    started = time.monotonic()
    record = await (await runner()).process(cancel_request(slurm_env.node, job))
    assert record.outcome == "ok", record.error
    assert record.detail == f"job {job} of root (debug) cancelled"
    await wait_for(lambda: slurm_env.job_state(job) == "", timeout=30, what="the job to leave the queue")
    assert time.monotonic() - started < 30
    again = await (await runner()).process(cancel_request(slurm_env.node, job))
    assert again.outcome == "ok" and "already ended" in (again.detail or "")


async def test_a_job_in_a_protected_partition_is_refused_and_keeps_running(slurm_env: SlurmCluster) -> None:
    job = await running(slurm_env, "--partition=protected")
    record = await (await runner(partitions=["protected"])).process(cancel_request(slurm_env.node, job))
    assert record.outcome == "refused"
    assert f"job {job}: partition protected is protected (protect.partitions)" in (record.error or "")
    assert slurm_env.job_state(job) == "RUNNING"
    slurm_env.run("scancel", job)


async def test_a_job_of_another_user_than_the_request_names_is_refused(slurm_env: SlurmCluster) -> None:
    job = await running(slurm_env)
    record = await (await runner()).process(cancel_request(slurm_env.node, job, user="alice"))
    assert record.outcome == "refused" and "belongs to root, not alice" in (record.error or "")
    assert slurm_env.job_state(job) == "RUNNING"
    slurm_env.run("scancel", job)


async def test_requeue_puts_a_running_job_back_in_the_queue(slurm_env: SlurmCluster) -> None:
    job = await running(slurm_env)
    record = await (await runner()).process(cancel_request(slurm_env.node, job, requeue=True))
    assert record.outcome == "ok" and "requeued" in (record.detail or "")
    assert " Restarts=1 " in slurm_env.run("scontrol", "show", "job", "-o", job)
    slurm_env.run("scancel", job)


async def test_a_job_name_that_spells_other_fields_cannot_pass_for_them(slurm_env: SlurmCluster) -> None:
    # `scontrol show job -o` puts the name before the job's own fields: this one read as partition debug
    job = await running(slurm_env, "--partition=protected", "--job-name=x Partition=debug Account=(null)")
    try:
        record = await (await runner(partitions=["protected"])).process(cancel_request(slurm_env.node, job))
        assert record.outcome == "refused", record.detail
        assert f"job {job}: partition protected is protected (protect.partitions)" in (record.error or "")
        assert slurm_env.job_state(job) == "RUNNING"
    finally:
        slurm_env.run("scancel", job)


async def test_a_cancel_claimed_by_a_node_the_job_does_not_run_on_is_refused_and_counted(
        slurm_env: SlurmCluster) -> None:
    job = await running(slurm_env)
    pending = slurm_env.sbatch("sleep 300", "--gres=gpu:1", "--hold")
    before = CONTRADICTED.by_node[slurm_env.node]
    try:
        elsewhere = await (await runner()).process(cancel_request("liar", job))
        not_running = await (await runner()).process(cancel_request(slurm_env.node, pending))
        assert elsewhere.outcome == "refused", elsewhere
        assert f"slurmctld shows job {job} running on {slurm_env.node}, not on liar" in (elsewhere.error or "")
        assert not_running.outcome == "refused" and "PENDING, not running" in (not_running.error or "")
        assert CONTRADICTED.by_node["liar"] == 1 and CONTRADICTED.by_node[slurm_env.node] == before + 1
        assert slurm_env.job_state(job) == "RUNNING" and slurm_env.job_state(pending) == "PENDING"
    finally:
        slurm_env.run("scancel", job, pending)


@pytest.mark.parametrize("job", ["1,2", "-u root", "gpu[01-02]", ""])
async def test_what_is_not_one_job_id_is_refused(slurm_env: SlurmCluster, job: str) -> None:
    record = await (await runner()).process(cancel_request(slurm_env.node, job))
    assert record.outcome == "refused"


async def test_cordon_drains_and_uncordon_resumes_the_real_node(slurm_env: SlurmCluster) -> None:
    node = slurm_env.node
    r = await ActionRunner.open(None, make_config())
    drain = await r.process(make_request("cordon", {"provider": "slurm", "reason": "idle GPUs (gpuevents)"},
                                         entity_kind="node", entity_id=node, node=node))
    assert drain.outcome == "ok", drain.error
    await wait_for(lambda: slurm_env.node_state() in ("drained", "draining"), timeout=15, what="drained")
    resume = await r.process(make_request("uncordon", {"provider": "slurm"}, entity_kind="node", entity_id=node,
                                          node=node))
    assert resume.outcome == "ok", resume.error
    await wait_for(lambda: slurm_env.node_state() == "idle", timeout=15, what="the node idle again")
