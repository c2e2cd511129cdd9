"""The held-out repro, end to end (agent snapshot → engine → runner → a real control plane): a node publishes, on
its own subject, a snapshot claiming another node's Deployment with an idle GPU and no controller uid. The
documented pruner rule (docs/kubernetes.md) decides a pause; the runner finds no pod of it on that node, refuses,
audits, and counts the claim against the node; the victim keeps its three replicas."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lightkube import codecs
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Pod

from actions.runner import ActionRunner
from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.cli.parts import add_runner_metrics
from gpuevents.clock import SystemClock
from gpuevents.config import Config, NatsConfig
from gpuevents.events import GpuInfo, JobInfo, NodeInfo, NodeSnapshot, make_event
from gpuevents.records import AuditRecord, decode_audit
from rules.engine.service import Engine
from tests.actions.test_evidence_cluster import deployment
from tests.kube_cluster import KubeCluster
from tests.waiting import wait_for

PRUNER = """\
rules:
  - name: pruner
    entity: job
    when: job.scheduler == 'kubernetes' and job.idle and job.namespace in ['NAMESPACE']
    actions:
      - {type: pause}
"""


async def test_a_hostile_nodes_claim_does_not_pause_a_workload_it_does_not_run(
        nats_config: NatsConfig, bus: Bus, tmp_path: Path, kube_cluster: KubeCluster) -> None:
    home, liar = kube_cluster.unique("gpu"), kube_cluster.unique("liar")
    kube_cluster.add_gpu_node(home)
    kube_cluster.add_gpu_node(liar)
    ns = kube_cluster.namespace("ml-dev")
    kube = kube_cluster.sync_client()
    kube.create(codecs.from_dict(deployment(ns, "victim", 3, home)))
    kube_cluster.wait(lambda: len([p for p in kube.list(Pod, namespace=ns) if p.status and
                                   p.status.phase == "Running"]) == 3, 60, "the victim's pods running")
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "pruner.yaml").write_text(PRUNER.replace("NAMESPACE", ns))
    config = Config.model_validate({
        "cluster": "c1", "nats": nats_config.model_dump(),
        "engine": {"rules": [str(rules)], "usage_db": str(tmp_path / "usage.sqlite")},
        "actions": {"kubernetes": {"kubeconfig": str(kube_cluster.kubeconfig)}, "timeout": 10,
                    "retry": {"max_attempts": 3, "backoff": 0.05, "backoff_max": 0.2}},
    })
    clock = SystemClock()
    engine = await Engine.open(config, bus, clock=clock)
    add_runner_metrics(engine.metrics.registry)  # as `gpuevents engine` serves them (gpuevents/cli/parts.py)
    runner = await ActionRunner.open(bus, config, clock)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(engine.run(stop)), asyncio.create_task(runner.run(stop))]
    try:
        await wait_for(lambda: engine.ready.is_set(), what="the engine to lead")
        now = clock.now()
        claim = NodeSnapshot(node=NodeInfo(name=liar, cluster="c1", gpu_count=1), gpus=[GpuInfo(
            node=liar, index=0, util_pct=0, idle=True, idle_since=now)], jobs=[JobInfo(
                id=f"{ns}/Deployment/victim", scheduler="kubernetes", namespace=ns, controller="Deployment/victim",
                gpus=[0])])
        bus.publish_event(make_event("node.snapshot", liar, claim, cluster="c1"))

        async def pause_outcome() -> AuditRecord | None:
            recs = [r async for m in bus.replay(S.STREAM_AUDIT, S.AUDIT_ALL) for r in decode_audit(m.data)]
            return next((r for r in recs if r.kind == "action" and r.action_type == "pause"), None)

        record = await wait_for(pause_outcome, timeout=30, what="the pause's outcome in the audit")
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await runner.close()
    assert record.outcome == "refused" and record.entity_id == f"job/kubernetes/{ns}/Deployment/victim", record
    assert f"contradicted at the source of truth ({liar})" in (record.error or "")
    assert kube.get(Deployment, "victim", namespace=ns).spec.replicas == 3
    counted = engine.metrics.registry.get_sample_value("gpuevents_claims_contradicted_total", {"node": liar})
    assert counted == 1


