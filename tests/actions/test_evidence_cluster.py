"""Evidence, not claims (DESIGN §3.4), on a real control plane: a remedy on a workload runs only when the API
server shows the workload's GPU pods on the reporting nodes, with the uid decided on; a contradicted claim is
refused, audited and counted for the node that made it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client, codecs
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Pod

from actions.evidence import CONTRADICTED, ContradictedClaims
from actions.runner import ActionRunner
from actions.store import MemoryKv
from gpuevents.records import AuditRecord
from tests.actions.conftest import make_config, make_request
from tests.kube_cluster import KubeCluster, meta, name_of


@pytest.fixture
def api(kube_cluster: KubeCluster) -> Iterator[Client]:
    with contextlib.closing(kube_cluster.sync_client()) as c:
        yield c


def deployment(ns: str, name: str, replicas: int, node: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": {
                "metadata": {"labels": {"app": name}}, "spec": {"nodeName": node, "containers": [{
                    "name": "main", "image": "serve:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


def claim(job: str, node: str, **job_facts: Any) -> dict[str, Any]:
    """What the engine sends for a job entity one node reported: an idle GPU of that node."""
    return {"node": {"name": node, "labels": {}},
            "job": {"id": job, "scheduler": "kubernetes", "nodes": [node], **job_facts},
            "gpus": [{"node": node, "index": 0, "idle": True, "util_pct": 0}]}


async def pause(cluster: KubeCluster, job: str, node: str, facts: dict[str, Any]) -> AuditRecord:
    runner = await ActionRunner.open(None, make_config(actions={"kubernetes": {"kubeconfig": str(cluster.kubeconfig)}}),
                                     kv=MemoryKv())
    try:
        return await runner.process(make_request("pause", {}, entity_kind="job", entity_id=f"job/kubernetes/{job}",
                                                 node=node, rule="pruner", facts=facts))
    finally:
        await runner.close()


def metric(node: str) -> float:
    for family in ContradictedClaims().collect():
        for sample in family.samples:
            if sample.labels.get("node") == node:
                return float(sample.value)
    return 0.0


def running_pods(api: Client, ns: str, n: int) -> bool:
    return len([p for p in api.list(Pod, namespace=ns) if p.status and p.status.phase == "Running"]) == n


async def test_a_node_claiming_a_workload_it_does_not_run_gets_it_refused_and_counted(
        kube_cluster: KubeCluster, api: Client) -> None:
    home, liar = kube_cluster.unique("gpu"), kube_cluster.unique("liar")
    kube_cluster.add_gpu_node(home)
    kube_cluster.add_gpu_node(liar)
    ns = kube_cluster.namespace("ml-dev")
    api.create(codecs.from_dict(deployment(ns, "victim", 3, home)))
    kube_cluster.wait(lambda: running_pods(api, ns, 3), 60, "the victim's three pods running")
    job = f"{ns}/Deployment/victim"
    before = metric(liar)

    record = await pause(kube_cluster, job, liar, claim(job, liar))  # no controller uid, an idle GPU

    assert record.outcome == "refused", record
    assert record.error is not None and "contradicted at the source of truth" in record.error
    assert f"no pod bound to {liar} belongs to Deployment {ns}/victim" in record.error
    assert record.slot_freed  # the engine gives its max_per_hour slot back
    assert api.get(Deployment, "victim", namespace=ns).spec.replicas == 3
    assert metric(liar) == before + 1 and CONTRADICTED.by_node[home] == 0


async def test_the_node_that_runs_it_gets_it_paused_with_the_uid_resolved(
        kube_cluster: KubeCluster, api: Client) -> None:
    home = kube_cluster.unique("gpu")
    kube_cluster.add_gpu_node(home)
    ns = kube_cluster.namespace("ml-dev")
    api.create(codecs.from_dict(deployment(ns, "idle", 2, home)))
    kube_cluster.wait(lambda: running_pods(api, ns, 2), 60, "two pods running")
    job = f"{ns}/Deployment/idle"

    record = await pause(kube_cluster, job, home, claim(job, home))

    assert record.outcome == "ok", record
    assert api.get(Deployment, "idle", namespace=ns).spec.replicas == 0
    assert metric(home) == 0


async def test_a_claim_naming_another_uid_or_more_gpus_than_the_pods_hold_is_refused(
        kube_cluster: KubeCluster, api: Client) -> None:
    home = kube_cluster.unique("gpu")
    kube_cluster.add_gpu_node(home)
    ns = kube_cluster.namespace("ml-dev")
    api.create(codecs.from_dict(deployment(ns, "one", 1, home)))
    kube_cluster.wait(lambda: running_pods(api, ns, 1), 60, "one pod running")
    job = f"{ns}/Deployment/one"
    uid = meta(api.get(Deployment, "one", namespace=ns)).uid

    old = await pause(kube_cluster, job, home, claim(job, home, controller_uid="an-older-one"))
    greedy = claim(job, home, controller_uid=uid)
    greedy["gpus"] = [{"node": home, "index": i, "idle": True} for i in range(4)]  # the pod holds one
    more = await pause(kube_cluster, job, home, greedy)

    assert old.outcome == "refused" and f"has uid {uid} on the API server" in (old.error or ""), old
    assert more.outcome == "refused" and "1 GPU(s) held by its pods, 4 claimed" in (more.error or ""), more
    assert api.get(Deployment, "one", namespace=ns).spec.replicas == 1
    assert metric(home) == 2


async def test_a_job_across_nodes_is_refused_when_one_of_them_does_not_hold_it(
        kube_cluster: KubeCluster, api: Client) -> None:
    a, liar = kube_cluster.unique("gpu"), kube_cluster.unique("liar")
    kube_cluster.add_gpu_node(a)
    kube_cluster.add_gpu_node(liar)
    ns = kube_cluster.namespace("ml-dev")
    api.create(codecs.from_dict(deployment(ns, "wide", 2, a)))
    kube_cluster.wait(lambda: running_pods(api, ns, 2), 60, "two pods running")
    job = f"{ns}/Deployment/wide"
    facts = claim(job, a)
    facts["job"]["nodes"] = [a, liar]  # the liar's name sorts after: its claim is not the one that decides
    facts["gpus"] = [{"node": a, "index": 0}, {"node": liar, "index": 0}]

    record = await pause(kube_cluster, job, a, facts)

    assert record.outcome == "refused" and f"({liar})" in (record.error or ""), record
    assert api.get(Deployment, "wide", namespace=ns).spec.replicas == 2
    assert metric(liar) == 1 and metric(a) == 0


async def test_cancel_of_a_pod_on_another_node_is_refused(kube_cluster: KubeCluster, api: Client) -> None:
    home, liar = kube_cluster.unique("gpu"), kube_cluster.unique("liar")
    kube_cluster.add_gpu_node(home)
    kube_cluster.add_gpu_node(liar)
    ns = kube_cluster.namespace("ml-dev")
    api.create(codecs.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
                                 "spec": {"nodeName": home, "containers": [{"name": "c", "image": "c:1", "resources": {
                                     "limits": {"nvidia.com/gpu": "1"}}}]}}))
    runner = await ActionRunner.open(
        None, make_config(actions={"kubernetes": {"kubeconfig": str(kube_cluster.kubeconfig)}}))
    try:
        record = await runner.process(make_request(
            "cancel", {"provider": "kubernetes"}, entity_kind="process", entity_id=f"{liar}/pid4242", node=liar,
            facts={"process": {"pid": 4242, "user": "alice", "pod": f"{ns}/p"}}))
    finally:
        await runner.close()
    assert record.outcome == "refused" and f"bound to {home}, not {liar}" in (record.error or ""), record
    assert [name_of(p) for p in api.list(Pod, namespace=ns)] == ["p"]
    assert metric(liar) == 1


async def test_scaling_down_the_job_a_liar_claims_is_refused_and_a_rule_named_target_is_not_asked(
        kube_cluster: KubeCluster, api: Client) -> None:
    home, liar = kube_cluster.unique("gpu"), kube_cluster.unique("liar")
    kube_cluster.add_gpu_node(home)
    kube_cluster.add_gpu_node(liar)
    ns = kube_cluster.namespace("ml-dev")
    api.create(codecs.from_dict(deployment(ns, "serve", 2, home)))
    kube_cluster.wait(lambda: running_pods(api, ns, 2), 60, "two pods running")
    target = {"kind": "Deployment", "namespace": ns, "name": "serve", "replicas": 0}
    runner = await ActionRunner.open(
        None, make_config(actions={"kubernetes": {"kubeconfig": str(kube_cluster.kubeconfig)}}),
        kv=MemoryKv())
    try:
        claimed = await runner.process(make_request("scale", target, entity_kind="gpu", entity_id=f"{liar}/gpu0",
                                                    node=liar, facts={"node": {"name": liar}, "gpu": {
                                                        "node": liar, "index": 0, "job": f"{ns}/Deployment/serve"}}))
        replicas = api.get(Deployment, "serve", namespace=ns).spec.replicas
        named = await runner.process(make_request("scale", target, entity_kind="node", entity_id=liar, node=liar,
                                                  rule="weekend-down", facts={"node": {"name": liar}}))
    finally:
        await runner.close()
    assert claimed.outcome == "refused" and f"no pod bound to {liar}" in (claimed.error or ""), claimed
    assert replicas == 2 and metric(liar) == 1
    assert named.outcome == "ok" and api.get(Deployment, "serve", namespace=ns).spec.replicas == 0


async def test_an_exemption_on_the_object_holds_whatever_the_node_said(
        kube_cluster: KubeCluster, api: Client) -> None:
    from datetime import UTC, datetime, timedelta

    home = kube_cluster.unique("gpu")
    kube_cluster.add_gpu_node(home)
    ns = kube_cluster.namespace("ml-dev")
    until = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    kept = deployment(ns, "kept", 1, home)
    kept["metadata"]["annotations"] = {"gpuevents.io/keep-until": until}
    api.create(codecs.from_dict(kept))
    kube_cluster.wait(lambda: running_pods(api, ns, 1), 60, "one pod running")
    job = f"{ns}/Deployment/kept"

    record = await pause(kube_cluster, job, home, claim(job, home, annotations={}))  # the node left it out

    assert record.outcome == "refused", record
    assert f"Deployment {ns}/kept is exempt by its annotation (gpuevents.io/keep-until: {until})" == record.error
    assert api.get(Deployment, "kept", namespace=ns).spec.replicas == 1
    assert metric(home) == 0 and record.slot_freed  # not a lie: the annotation may be newer than the report
