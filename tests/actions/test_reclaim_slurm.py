"""The library's reclaim.yaml on a small real Slurm cluster (one node, two jobs, one of them idle while GPUs are
waited for): max_fleet_pct 20 would hold the cancel for good (1 of 2 jobs is 50%); its fleet_floor lets the engine
decide it, and the runner cancels the job once slurmctld confirms it runs on the reporting node."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from actions.runner import ActionRunner
from gpuevents.config import Config
from gpuevents.events import (
    SCHEDULER_SOURCE,
    DemandEntry,
    DemandEvent,
    DemandReport,
    GpuInfo,
    JobInfo,
    NodeInfo,
    NodeSnapshot,
    SnapshotEvent,
)
from gpuevents.records import ActionRequest
from rules.core.core import ActionOutcome, Core
from rules.lang.loader import load_rule_set
from tests.actions.conftest import make_config
from tests.actions.test_slurm import running, slurm_env  # noqa: F401 - the fixture
from tests.slurm_cluster import SlurmCluster
from tests.waiting import wait_for

RECLAIM = Path(__file__).parents[2] / "rules" / "library" / "reclaim.yaml"


def decide(node: str, idle_job: str, busy_job: str) -> list[ActionRequest]:
    """46 minutes of the engine, ending now: the idle job mailed at 30 minutes (delivered), its cancel at 45."""
    core = Core(load_rule_set([RECLAIM]), Config())
    start = datetime.now(UTC) - timedelta(minutes=46)
    core.step(DemandEvent(source=f"node/{SCHEDULER_SOURCE}", time=start, data=DemandReport(
        scheduler="slurm", entries=[DemandEntry(partition="debug", pending_gpus=1, waiting_since=start)])), start)
    out: list[ActionRequest] = []
    for minute in range(47):
        t = start + timedelta(minutes=minute)
        snap = NodeSnapshot(node=NodeInfo(name=node), gpus=[
            GpuInfo(node=node, index=0, util_pct=0, idle=True, idle_since=start),
            GpuInfo(node=node, index=1, util_pct=90, idle=False)], jobs=[
            JobInfo(id=idle_job, user="root", partition="debug", gpus=[0]),
            JobInfo(id=busy_job, user="root", partition="debug", gpus=[1])])
        step = core.step(SnapshotEvent(source=f"node/{node}", time=t, data=snap), t)
        for r in step.actions:
            out.append(r)
            if r.type == "email":  # the SMTP server accepted it
                core.step(ActionOutcome(rule=r.rule, incident_id=r.incident_id, key=r.key, outcome="ok"), t)
    return out


async def test_reclaim_cancels_the_idle_job_of_a_small_cluster(slurm_env: SlurmCluster) -> None:  # noqa: F811
    idle_job, busy_job = await running(slurm_env, "--mem=100"), await running(slurm_env, "--mem=100")
    try:
        decided = decide(slurm_env.node, idle_job, busy_job)
        assert [(r.type, r.decision, r.entity_id) for r in decided] == [
            ("email", "run", f"job/slurm/{idle_job}"), ("cancel", "run", f"job/slurm/{idle_job}")]
        record = await (await ActionRunner.open(None, make_config(protect={"users": []}))).process(decided[1])
        assert record.outcome == "ok" and f"job {idle_job} of root (debug) cancelled" == record.detail, record
        await wait_for(lambda: slurm_env.job_state(idle_job) == "", timeout=30, what="the idle job gone")
        assert slurm_env.job_state(busy_job) == "RUNNING"
    finally:
        slurm_env.run("scancel", idle_job, busy_job, check=False)
