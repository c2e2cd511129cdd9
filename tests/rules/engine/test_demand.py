"""Demand readers: a real Slurm queue read by squeue, pending pods through a stub lister, and the engine that
keeps the reports it publishes (and believes them only from the demand reader's subject)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import orjson
import pytest
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.clock import SystemClock
from gpuevents.config import Config
from gpuevents.config.sched import DemandConfig, DemandKubernetesConfig, DemandSlurmConfig
from gpuevents.events import SCHEDULER_SOURCE, DemandEntry, DemandReport, encode_event, make_event
from rules.engine.demand import KubernetesDemandReader, LightkubePods, SlurmDemandReader
from rules.engine.read.dashboard_source import EngineDashboardSource
from rules.engine.service import Engine
from tests.gpuevents.cli.test_client import gpuevents, write_config
from tests.kube_cluster import KubeCluster
from tests.rules.engine.helpers import running
from tests.slurm_cluster import SlurmCluster
from tests.waiting import wait_for


async def test_the_slurm_reader_counts_the_gpus_a_real_queue_waits_for(
        slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch, engine_config: Config, bus: Bus) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    holder = slurm.sbatch("sleep 300", "--gres=gpu:2")  # both GPUs: the next jobs wait
    waiting = [slurm.sbatch("sleep 300", "--gres=gpu:1"), slurm.sbatch("sleep 300", "--gres=gpu:2")]
    try:
        await wait_for(lambda: slurm.job_state(holder) == "RUNNING", timeout=30, what="the holder running")
        await wait_for(lambda: all(slurm.job_state(j) == "PENDING" for j in waiting), timeout=30, what="pending")
        report = await SlurmDemandReader(DemandSlurmConfig(interval=30)).read()
        assert report is not None and report.valid_for_s == 90
        by_partition = {e.partition: e for e in report.entries if e.partition is not None}
        assert set(by_partition) == {"debug"}
        assert by_partition["debug"].pending_gpus == 3
        assert by_partition["debug"].waiting_since is not None

        # the engine holding the lease runs the reader (config demand.slurm) and keeps what it publishes
        reading = DemandConfig(slurm=DemandSlurmConfig(enabled=True, interval=5))
        config = engine_config.model_copy(update={"demand": reading})
        async with running(await Engine.open(config, bus, clock=SystemClock())) as engine:
            book = engine.core.state.demand
            await wait_for(lambda: book.lookup("c1", "debug", None, None)[0] == 3, timeout=30,
                           what="the engine's own demand reading")
    finally:
        slurm.run("scancel", holder, *waiting, check=False)


async def test_a_missing_squeue_is_counted_and_reports_nothing(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    reader = SlurmDemandReader(DemandSlurmConfig(squeue=tmp_path / "no-squeue"))
    with caplog.at_level(logging.WARNING, logger="rules.engine.demand"):
        assert await reader.read() is None
        assert await reader.read() is None
    assert reader.failures.count == 2
    assert len([r for r in caplog.records if "cannot be run" in r.getMessage()]) == 1  # logged once


class StubPods:
    def __init__(self, pods: list[dict[str, Any]] | Exception) -> None:
        self.pods = pods

    async def pending_pods(self) -> list[dict[str, Any]]:
        if isinstance(self.pods, Exception):
            raise self.pods
        return self.pods


async def test_the_kubernetes_reader_reports_pending_gpu_pods_and_survives_an_api_error() -> None:
    pod = {"metadata": {"creationTimestamp": "2026-12-03T10:00:00Z"}, "status": {"phase": "Pending"},
           "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}],
                    "nodeSelector": {"karpenter.sh/nodepool": "gpu-spot"}}}
    report = await KubernetesDemandReader(DemandKubernetesConfig(), StubPods([pod])).read()
    assert report is not None and report.scheduler == "kubernetes"
    assert {(e.pool, e.pending_gpus) for e in report.entries} == {("gpu-spot", 4), (None, 4)}
    failing = KubernetesDemandReader(DemandKubernetesConfig(), StubPods(ConnectionError("refused")))
    assert await failing.read() is None and failing.failures.count == 1


async def test_the_engine_keeps_demand_from_the_reader_and_dead_letters_it_from_an_agent(
        engine_config: Config, bus: Bus, tmp_path: Path) -> None:
    async with running(await Engine.open(engine_config, bus, clock=SystemClock())) as engine:
        now = SystemClock().now()
        spoof = make_event("scheduler.demand", "node-a",
                           DemandReport(scheduler="slurm", entries=[DemandEntry(partition="gpu", pending_gpus=99)]),
                           cluster="c1", time=now)
        await bus.js_publish(S.event_subject("c1", "node-a", "scheduler.demand"), encode_event(spoof),
                             msg_id=spoof.id)
        real = make_event("scheduler.demand", SCHEDULER_SOURCE,
                          DemandReport(scheduler="slurm", entries=[DemandEntry(partition="gpu", pending_gpus=3,
                                                                               waiting_since=now)]),
                          cluster="c1", time=now)
        bus.publish_event(real)
        assert await bus.flush(5)
        book = engine.core.state.demand
        await wait_for(lambda: book.reports, what="the reader's report in the engine")
        assert book.lookup("c1", "gpu", None, None)[0] == 3
        assert engine.metrics.malformed.labels(kind="spoofed")._value.get() == 1

        # `gpuevents status` and the dashboard's /api/fleet show it
        code, out = await gpuevents("status", "--json", "-c", str(write_config(engine_config, tmp_path / "c.yaml")))
        assert code == 0, out
        [line] = orjson.loads(out)["demand"]
        assert (line["partition"], line["pending_gpus"], line["scheduler"]) == ("gpu", 3, "slurm")
        assert line["waiting_for_s"] >= 0
        dashboard = EngineDashboardSource(engine)  # shares a read model up to MAX_AGE_S old: the next one has it

        async def shown() -> list[tuple[str | None, int]]:
            return [(d.partition, d.pending_gpus) for d in (await dashboard.fleet()).demand]

        assert await wait_for(shown, what="the demand on the dashboard") == [("gpu", 3)]


async def test_pending_gpu_pods_of_a_real_control_plane_are_demand_per_pool(kube_cluster: KubeCluster) -> None:
    ns = kube_cluster.namespace("demand")
    pool = kube_cluster.unique("pool")
    kube_cluster.add_gpu_node(kube_cluster.unique("gpu-node"), gpus=2, labels={"pool": pool})

    def pod(name: str, resources: dict[str, str]) -> Pod:
        return Pod(metadata=ObjectMeta(name=name, namespace=ns),
                   spec=PodSpec(nodeSelector={"pool": pool}, containers=[
                       Container(name="c", image="train", resources=ResourceRequirements(limits=resources))]))

    client = kube_cluster.client()
    try:
        await client.create(pod("runs", {"nvidia.com/gpu": "1"}))  # fits: scheduled, Running (kwok)
        await client.create(pod("waits", {"nvidia.com/gpu": "4"}))  # more than the node has: Pending
        await client.create(pod("slice", {"nvidia.com/mig-1g.10gb": "1"}))  # no node offers it: Pending

        async def phase(name: str) -> str | None:
            got = await client.get(Pod, name, namespace=ns)
            return got.status.phase if got.status else None

        await wait_for(lambda: _is(phase("runs"), "Running"), timeout=60, what="the fitting pod running")
        reader = KubernetesDemandReader(DemandKubernetesConfig(enabled=True), LightkubePods(client))
        report = await reader.read()
        assert report is not None and reader.failures.count == 0
        mine = {(e.pool, e.model): e.pending_gpus for e in report.entries if e.pool == pool}
        assert mine == {(pool, None): 5}  # the 4-GPU pod and the MIG slice; the running pod is not demand
        assert any(e.model == "mig-1g.10gb" and e.pending_gpus >= 1 for e in report.entries)
    finally:
        await client.close()


async def _is(value: Awaitable[object], expected: str) -> bool:
    return await value == expected
