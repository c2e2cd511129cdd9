"""The agent's loop with the kubelet's PodResources API (a test server speaking its proto on a unix socket):
snapshots mark each GPU allocated to its pod's job and carry one Kubernetes job per top owner; when the socket
goes away, allocations become unknown (null), not false."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from agent.kubeowners import Meta, OwnerRef, OwnerWalker
from agent.podresources.client import PodResources
from agent.runner import run_nodes, simulated_agents
from gpuevents.bus import Handler, Message, Subscription
from gpuevents.clock import SystemClock
from gpuevents.config import AgentConfig, Config
from gpuevents.config.kube import KubernetesJobsConfig
from gpuevents.events import Event, SnapshotEvent
from tests.waiting import wait_for


class Capture:
    connected = False

    def __init__(self) -> None:
        self.snapshots: list[SnapshotEvent] = []

    def publish_event(self, event: Event) -> None:
        if isinstance(event, SnapshotEvent):
            self.snapshots.append(event)

    async def serve(self, subject: str, handler: Handler, queue: str | None = None, *, concurrency: int = 1,
                    what: str = "request") -> Subscription:
        async def answer(m: Message) -> None:
            await handler(m)

        return Subscription(subject, answer, concurrency, what)  # never subscribed: no command comes


def start_kubelet(sock: Path, pods: list[list[str]]) -> subprocess.Popen[bytes]:
    """The test kubelet in a process of its own, so that killing it takes its connections too."""
    p = subprocess.Popen([sys.executable, "-m", "tests.kube.podresources_server", str(sock), json.dumps(pods)],
                         stdout=subprocess.PIPE, cwd=str(Path(__file__).parents[2]))
    assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
    return p


async def owners(api_version: str, kind: str, ns: str, name: str) -> Meta | None:
    if kind == "Pod":
        return Meta("v1", "Pod", ns, name, f"u-{name}", owner=OwnerRef("batch/v1", "Job", "train", "j1"))
    if kind == "Job":
        return Meta("batch/v1", "Job", ns, "train", "j1", generation=1)
    return None


async def test_snapshots_carry_the_kubelets_allocation_and_the_job_of_each_pod() -> None:
    cfg = Config(agent=AgentConfig(node_name="k8s-0", sample_interval=0.05, snapshot_interval=0.1))
    (agent,) = simulated_agents(cfg, nodes=1, gpus_per_node=4, scenario="demo", start=datetime.now(UTC))
    agent.tick(datetime.now(UTC))
    uuids = [agent.core.readings[i].uuid for i in sorted(agent.core.readings)]
    d = Path(tempfile.mkdtemp(prefix="kl"))
    pods = [["ml", "train-0", uuids[0], f"{uuids[1]}::2"], ["ml", "train-1", uuids[2]], ["kube-system", "dns"]]
    kubelet = start_kubelet(d / "kubelet.sock", pods)
    bus, stop = Capture(), asyncio.Event()
    pr = PodResources(d / "kubelet.sock", ["nvidia.com/gpu"], refresh_s=0.05)
    task = asyncio.create_task(run_nodes([agent], bus, config=cfg, clock=SystemClock(), stop=stop,
                                         allocations=(pr, OwnerWalker(owners, KubernetesJobsConfig()))))
    try:
        snap = await wait_for(lambda: next((s for s in reversed(bus.snapshots) if s.data.jobs), None), 10,
                              what="a snapshot with the kubelet's allocation")
        gpus = {g.index: (g.allocated, g.job) for g in snap.data.gpus}
        assert gpus == {0: (True, "ml/Job/train"), 1: (True, "ml/Job/train"), 2: (True, "ml/Job/train"),
                        3: (False, None)}
        (job,) = snap.data.jobs
        assert (job.scheduler, job.id, job.controller, job.pods, job.gpus) == (
            "kubernetes", "ml/Job/train", "Job/train", ["train-0", "train-1"], [0, 1, 2])
        kubelet.kill()  # the kubelet is gone, its connections too
        kubelet.wait()
        (d / "kubelet.sock").unlink(missing_ok=True)
        n = len(bus.snapshots)
        unknown = await wait_for(lambda: next((s for s in bus.snapshots[n:] if all(
            g.allocated is None for g in s.data.gpus)), None), 10, what="allocations unknown")
        assert unknown.data.jobs == []
    finally:
        stop.set()
        await task
        if kubelet.poll() is None:
            kubelet.kill()
            kubelet.wait()
        shutil.rmtree(d, ignore_errors=True)
