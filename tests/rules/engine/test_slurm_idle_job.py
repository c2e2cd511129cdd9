"""A Slurm job that never touches its GPU, end to end on a real Slurm: `sbatch --gres=gpu:1` → slurmd's prolog
writes the mapping and the job's details → the agent (simulated NVML, the real mapping directory, real squeue)
→ engine → the library's `job-idle-1h` (its text, durations shortened) mails the job's user through a real
SMTP server → the staged cancel ends the job → squeue shows it gone; the audit names the user and partition."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller

from actions.runner import ActionRunner
from agent.nvml import NvmlSampler
from agent.runner import NodeAgent, run_nodes
from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.clock import SystemClock
from gpuevents.config import Config, NatsConfig
from gpuevents.events import NodeSnapshot
from gpuevents.records import AuditRecord, decode_audit
from gpuevents.server import free_port
from rules.engine.service import Engine
from rules.usage.jobstore import JobStore, JobSummary
from tests.actions.builtin.test_email import Inbox
from tests.agent.fake_pynvml import FakeDevice, FakeNvml
from tests.slurm_cluster import SlurmCluster
from tests.waiting import wait_for

LIBRARY = Path(__file__).resolve().parents[3] / "rules" / "library" / "jobs.yaml"


def short_library_rules() -> str:
    """rules/library/jobs.yaml as shipped, its hours made seconds so the test runs in seconds, and its fleet
    share raised: in a fleet of one job, that job is 100 % of it (the 20 % cap holds the cancel, as it should)."""
    text = LIBRARY.read_text()
    assert "for: 1h" in text and "after: 1h" in text and "max_fleet_pct: 20" in text
    return (text.replace("for: 1h", "for: 2s").replace("after: 1h", "after: 3s")
            .replace("max_fleet_pct: 20", "max_fleet_pct: 100"))


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


async def test_an_idle_slurm_job_is_mailed_to_its_user_then_cancelled(
    slurm: SlurmCluster, nats_config: NatsConfig, bus: Bus, tmp_path: Path, smtp: tuple[Inbox, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inbox, port = smtp
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))  # the agent's squeue and the runner's scancel
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "jobs.yaml").write_text(short_library_rules())
    (rules / "job-summary.yaml").write_text((LIBRARY.parent / "job-summary.yaml").read_text())
    config = Config.model_validate({
        "cluster": "c1",
        "nats": nats_config.model_dump(),
        "agent": {"node_name": slurm.node, "sample_interval": 0.2, "snapshot_interval": 0.5,
                  "hpc_job_mapping_dir": str(slurm.job_map_dir)},
        "engine": {"rules": [str(rules)], "tick": "1s", "usage_db": str(tmp_path / "usage.sqlite")},
        "actions": {"email": {"host": "127.0.0.1", "port": port, "sender": "gpuevents@hpc.example.org",
                              "default_domain": "hpc.example.org"},
                    "timeout": 15, "retry": {"max_attempts": 3, "backoff": 0.05, "backoff_max": 0.2}},
        "protect": {"users": []},
    })
    job = slurm.sbatch("sleep 300", "--gres=gpu:1", "--job-name=never-uses-it", "--time=30")
    await wait_for(lambda: slurm.job_state(job) == "RUNNING", timeout=30, what=f"job {job} running")
    await wait_for(lambda: (slurm.job_map_dir / ".jobs" / job).exists(), timeout=30, what="the prolog's details")

    snapshots: list[NodeSnapshot] = []
    nvml = FakeNvml([FakeDevice(uuid=f"GPU-{i}", util=0) for i in range(2)])
    agent = NodeAgent(config, NvmlSampler(nvml), node=slurm.node)
    original = agent.core.snapshot

    def spy(now):  # type: ignore[no-untyped-def]  # wraps the method below
        snap = original(now)
        snapshots.append(snap)
        return snap

    agent.core.snapshot = spy  # type: ignore[method-assign]  # a spy on the instance
    clock = SystemClock()
    engine = await Engine.open(config, bus, clock=clock)
    runner = await ActionRunner.open(bus, config, clock)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(engine.run(stop)), asyncio.create_task(runner.run(stop)),
             asyncio.create_task(run_nodes([agent], bus, config=config, clock=clock, stop=stop))]
    try:
        # the agent knows whose job it is, with nothing running on its GPU
        def described() -> bool:
            return any(j.id == job and j.time_limit_s is not None for s in snapshots for j in s.jobs)

        await wait_for(described, timeout=30, what="the job's details in a snapshot")
        info = next(j for s in reversed(snapshots) for j in s.jobs if j.id == job)
        assert (info.user, info.partition, info.name, info.time_limit_s) == ("root", "debug", "never-uses-it", 1800)
        assert info.pids == [] and info.started_at is not None

        await wait_for(lambda: bool(inbox.messages), timeout=60, what="the warning mail")
        [(rcpts, msg)] = inbox.messages[:1]
        assert rcpts == ["root@hpc.example.org"]
        assert msg["Subject"] == f"Job {job}: 1 idle GPU(s)"
        assert "(never-uses-it)" in msg.get_payload()

        await wait_for(lambda: slurm.job_state(job) == "", timeout=60, what="the staged cancel to end the job")

        async def cancelled() -> AuditRecord | None:
            recs = [r async for m in bus.replay(S.STREAM_AUDIT, S.AUDIT_ALL) for r in decode_audit(m.data)]
            return next((r for r in recs if r.kind == "action" and r.action_type == "cancel"
                         and r.outcome is not None), None)

        record = await wait_for(cancelled, timeout=30, what="the cancel's audit record")
        assert record.outcome == "ok", record.error
        assert record.detail == f"job {job} of root (debug) cancelled"
        # the epilog cleared the mapping: the job leaves the agent's snapshots, and its summary is kept
        await wait_for(lambda: not (slurm.job_map_dir / ".jobs" / job).exists(), timeout=30, what="the epilog")

        def summary() -> JobSummary | None:
            with JobStore(tmp_path / "usage.sqlite") as store:
                found = [s for s in store.find(job) if not s.running]
            return found[0] if found else None

        ended = await wait_for(summary, timeout=30, what="the job's summary in the usage store")
        assert (ended.user, ended.partition, ended.name, ended.gpu_count) == ("root", "debug", "never-uses-it", 1)
        assert ended.mean_util_pct == 0 and ended.idle_share_pct == 100 and ended.gpu_hours > 0
        # and the job.ended occasion mails its user the summary (the optional library rule)
        await wait_for(lambda: len(inbox.messages) >= 3, timeout=30, what="the summary mail")
        subjects = [m["Subject"] for _, m in inbox.messages]
        assert f"Job {job} ended: 0 % of 1 GPU(s)" in subjects
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await runner.close()
        slurm.run("scancel", job, check=False)
