"""One fleet across schedulers (DESIGN §9): a Slurm site and a Kubernetes site in one engine, at once, on the real
Slurm and the real control plane. Each site's agent (simulated NVML, idle GPUs) reports its job — the Slurm job
from slurmd's prolog and squeue, the Kubernetes Job from the kubelet's allocation and the API's owner walk — and
the engine sees both together: status, free and the job summaries name each site, and one rule fires per site."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from pathlib import Path

import orjson
import pytest
from lightkube import codecs
from lightkube.resources.core_v1 import Pod

from agent.kubeapi import open_fetch
from agent.kubeowners import OwnerWalker
from agent.nvml import NvmlSampler
from agent.podresources.client import PodResources
from agent.runner import NodeAgent, run_nodes
from gpuevents.bus import Bus
from gpuevents.clock import SystemClock
from gpuevents.config import Config, KubernetesConfig, NatsConfig
from gpuevents.config.kube import KubernetesJobsConfig
from rules.engine.service import Engine
from tests.agent.fake_pynvml import FakeDevice, FakeNvml
from tests.agent.test_agent_kubernetes import start_kubelet
from tests.gpuevents.cli.test_client import gpuevents
from tests.kube.test_owners_cluster import POD_SPEC
from tests.kube_cluster import KubeCluster, meta, name_of
from tests.slurm_cluster import SlurmCluster
from tests.waiting import wait_for

RULES = """\
rules:
  - name: idle-job
    description: every GPU of a job idle
    entity: job
    when: job.idle
    for: 2s
    actions:
      - {type: log, message: "job {{ job.id }} idle"}
"""


def site_config(base: dict[str, object], cluster: str, **agent: object) -> Config:
    return Config.model_validate({**base, "cluster": cluster,
                                  "agent": {"sample_interval": 0.2, "snapshot_interval": 0.5, **agent}})


def _kube_job(cluster: KubeCluster) -> tuple[str, str]:
    """A Job whose one pod the scheduler placed on a kwok GPU node: (namespace, pod)."""
    cluster.add_gpu_node(cluster.unique("gpu"))
    ns = cluster.namespace("fleet")
    with contextlib.closing(cluster.sync_client()) as api:
        api.create(codecs.from_dict({
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": ns},
            "spec": {"template": {"metadata": {"labels": {"job": "train"}},
                                  "spec": {**POD_SPEC, "restartPolicy": "Never"}}}}))

        def pod() -> str | None:
            got = [name_of(p) for p in api.list(Pod, namespace=ns) if (meta(p).labels or {}).get("job") == "train"]
            return got[0] if got else None

        return ns, cluster.wait(pod, 60, "the Job's pod")


async def test_a_slurm_site_and_a_kubernetes_site_are_one_fleet(
    slurm: SlurmCluster, kube_cluster: KubeCluster, nats_config: NatsConfig, bus: Bus, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))  # the Slurm agent's squeue
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "idle-job.yaml").write_text(RULES)
    base: dict[str, object] = {"nats": nats_config.model_dump(),
                               "engine": {"rules": [str(rules)], "tick": "1s",
                                          "usage_db": str(tmp_path / "usage.sqlite")}}
    engine_config = site_config(base, "hub")
    slurm_config = site_config(base, "slurm-a", node_name=slurm.node, hpc_job_mapping_dir=str(slurm.job_map_dir))
    kube_config = site_config(base, "kube-b", node_name="k8s-0")
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(orjson.dumps(engine_config.model_dump(mode="json", include={"cluster", "nats", "engine"}))
                        .decode())

    job = slurm.sbatch("sleep 300", "--gres=gpu:1", "--job-name=idle-run", "--time=30")
    await wait_for(lambda: (slurm.job_map_dir / ".jobs" / job).exists(), 30, what="the prolog's details")
    ns, pod = await asyncio.to_thread(_kube_job, kube_cluster)
    sock_dir = Path(tempfile.mkdtemp(prefix="kl"))
    kubelet = start_kubelet(sock_dir / "kubelet.sock", [[ns, pod, "GPU-k0"]])
    fetch, close_fetch = open_fetch(KubernetesConfig(kubeconfig=kube_cluster.kubeconfig))

    slurm_agent = NodeAgent(slurm_config, NvmlSampler(FakeNvml([FakeDevice(uuid=f"GPU-s{i}") for i in range(2)])),
                            node=slurm.node)
    kube_agent = NodeAgent(kube_config, NvmlSampler(FakeNvml([FakeDevice(uuid=f"GPU-k{i}") for i in range(2)])),
                           node="k8s-0")
    clock = SystemClock()
    engine = await Engine.open(engine_config, bus, clock=clock)
    stop = asyncio.Event()
    pr = PodResources(sock_dir / "kubelet.sock", ["nvidia.com/gpu"], refresh_s=0.2)
    tasks = [asyncio.create_task(engine.run(stop)),
             asyncio.create_task(run_nodes([slurm_agent], bus, config=slurm_config, clock=clock, stop=stop)),
             asyncio.create_task(run_nodes([kube_agent], bus, config=kube_config, clock=clock, stop=stop,
                                           allocations=(pr, OwnerWalker(fetch, KubernetesJobsConfig()))))]
    try:
        def firing() -> list[tuple[str, str]] | None:
            got = sorted((i.cluster, i.entity_id) for i in (engine.core.open_incidents() if engine.core else [])
                         if i.rule == "idle-job" and i.status == "firing")
            return got if len(got) == 2 else None

        both = await wait_for(firing, 90, 0.2, what="the idle-job rule firing at both sites")
        assert [c for c, _ in both] == ["kube-b", "slurm-a"]
        assert any(f"{ns}/Job/train" in e for _, e in both) and any(job in e for _, e in both)

        code, out = await gpuevents("status", "--all", "--json", "-c", str(cfg_file))
        assert code == 0, out
        lines = [orjson.loads(line) for line in out.splitlines()]
        nodes = {(x["node"]["cluster"], x["node"]["name"]) for x in lines if "node" in x}
        assert nodes == {("slurm-a", slurm.node), ("kube-b", "k8s-0")}
        assert sorted(x["incident"]["cluster"] for x in lines if "incident" in x) == ["kube-b", "slurm-a"]

        code, out = await gpuevents("free", "--count", "1", "--json", "-c", str(cfg_file))
        assert code == 0, out
        free = orjson.loads(out)  # each site's unallocated GPU, the allocated ones left out
        assert (free["free_gpus"], free["excluded"]) == (2, {"allocated": 2})
        assert {n["cluster"] for n in free["nodes"]} == {"slurm-a", "kube-b"}

        async def jobs() -> list[tuple[str, str, str]] | None:
            code, out = await gpuevents("jobs", "--json", "-c", str(cfg_file))
            got = sorted((j["cluster"], j["scheduler"], j["id"]) for j in orjson.loads(out)) if code == 0 else []
            return got if len(got) == 2 else None

        assert await wait_for(jobs, 30, 0.5, what="both sites' jobs in the usage store") == [
            ("kube-b", "kubernetes", f"{ns}/Job/train"), ("slurm-a", "slurm", job)]
        async def report() -> list[tuple[str, str | None]] | None:
            code, out = await gpuevents("report", "--format", "json", "-c", str(cfg_file))
            got = sorted((j["cluster"], j["job_id"]) for j in orjson.loads(out)["top_idle_jobs"]) if code == 0 else []
            return got if len(got) == 2 else None

        assert await wait_for(report, 30, 0.5, what="both sites' idle jobs in the weekly report") == [
            ("kube-b", f"{ns}/Job/train"), ("slurm-a", job)]
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await close_fetch()
        kubelet.kill()
        kubelet.wait()
        shutil.rmtree(sock_dir, ignore_errors=True)
        slurm.run("scancel", job, check=False)

