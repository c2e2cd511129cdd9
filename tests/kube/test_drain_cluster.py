"""drain against a real control plane: the node cordoned, its GPU pods evicted through the Eviction API; a
PodDisruptionBudget that allows no disruption holds its pods until the timeout, then `wait` leaves them and
`delete` deletes them; pods without GPUs and protected ones are left."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client, codecs
from lightkube.resources.core_v1 import Event, Node, Pod

from actions.runner import ActionRunner
from gpuevents.records import AuditRecord
from tests.actions.conftest import make_config, make_request
from tests.kube_cluster import KubeCluster, meta, name_of

GPU = {"limits": {"nvidia.com/gpu": "1"}}


@pytest.fixture
def api(kube_cluster: KubeCluster) -> Iterator[Client]:
    with contextlib.closing(kube_cluster.sync_client()) as c:
        yield c


def workload(api: Client, ns: str, name: str, replicas: int, node: str, resources: dict[str, Any]) -> None:
    api.create(codecs.from_dict({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {
                     "nodeName": node, "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "main", "image": "x:1", "resources": resources}]}}}}))


def running(cluster: KubeCluster, api: Client, ns: str, app: str, n: int) -> list[str]:
    def ok() -> list[str] | None:
        pods = [p for p in api.list(Pod, namespace=ns, labels={"app": app})
                if p.status and p.status.phase == "Running" and not meta(p).deletionTimestamp]
        return [name_of(p) for p in pods] if len(pods) == n else None

    return cluster.wait(ok, 60, f"{n} running pods of {app}")


async def drain(cluster: KubeCluster, node: str, **params: Any) -> AuditRecord:
    runner = await ActionRunner.open(None, make_config(actions={"kubernetes": {"kubeconfig": str(cluster.kubeconfig)}}))
    try:
        return await runner.process(make_request("drain", params, entity_kind="node", entity_id=node, node=node))
    finally:
        await runner.close()


async def test_drain_cordons_and_evicts_gpu_pods_and_a_budget_holds_its_pods(
        kube_cluster: KubeCluster, api: Client) -> None:
    node = kube_cluster.unique("drain")
    kube_cluster.add_gpu_node(node)
    ns = kube_cluster.namespace("drain")
    workload(api, ns, "free", 2, node, GPU)
    workload(api, ns, "guarded", 1, node, GPU)
    workload(api, ns, "cpu", 1, node, {"limits": {"cpu": "1"}})
    api.create(codecs.from_dict({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                 "metadata": {"name": "guarded", "namespace": ns},
                                 "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}}))
    free = running(kube_cluster, api, ns, "free", 2)
    (guarded,) = running(kube_cluster, api, ns, "guarded", 1)
    (cpu,) = running(kube_cluster, api, ns, "cpu", 1)

    record = await drain(kube_cluster, node, timeout="3s")
    assert record.outcome == "ok", record
    spec = api.get(Node, node).spec
    assert spec is not None and spec.unschedulable is True
    detail = record.detail or ""
    assert "2 GPU pod(s) evicted" in detail
    assert "1 still running at the 3s timeout" in detail and f"{ns}/{guarded}" in detail
    assert "after_timeout: wait" in detail
    present = {name_of(p) for p in api.list(Pod, namespace=ns)}
    assert guarded in present and cpu in present   # the budget's pod and the pod without a GPU stay
    reasons = [e.reason for e in api.list(Event, namespace=ns) if e.involvedObject.name in free]
    assert "GpueventsEvicted" in reasons

    record = await drain(kube_cluster, node, timeout="1s", after_timeout="delete")
    assert record.outcome == "ok" and f"1 deleted after the 1s timeout (PodDisruptionBudget): {ns}/{guarded}" in (
        record.detail or "")
    kube_cluster.wait(lambda: guarded not in {name_of(p) for p in api.list(Pod, namespace=ns)}, 30,
                      "the guarded pod deleted")


async def test_drain_leaves_protected_namespaces(kube_cluster: KubeCluster, api: Client) -> None:
    node = kube_cluster.unique("drain")
    kube_cluster.add_gpu_node(node)
    ns = kube_cluster.namespace("drain")
    workload(api, ns, "w", 1, node, GPU)
    (pod,) = running(kube_cluster, api, ns, "w", 1)
    runner = await ActionRunner.open(
        None, make_config(actions={"kubernetes": {"kubeconfig": str(kube_cluster.kubeconfig)}},
                          protect={"namespaces": [ns]}))
    try:
        record = await runner.process(make_request("drain", {"timeout": "1s"}, entity_kind="node", entity_id=node,
                                                   node=node))
    finally:
        await runner.close()
    assert record.outcome == "ok" and f"{ns}/{pod} (namespace {ns} is protected)" in (record.detail or "")
    assert pod in {name_of(p) for p in api.list(Pod, namespace=ns)}
