"""cordon and uncordon through lightkube against a real Kubernetes control plane (tests/kube_cluster.py): the
flag and the annotation, a GPU rule's node, a person's cordon left alone, an unknown node; the API server's 5xx,
which a real one does not answer on demand, against the stand-in."""

from __future__ import annotations

import json
from pathlib import Path

from lightkube.resources.core_v1 import Node

from actions.builtin.cordon import ANNOTATION, CORDONED
from tests.actions.builtin.kube_objects import runner_for
from tests.actions.conftest import make_request
from tests.actions.fakes import FakeKubernetes, Injected
from tests.kube_cluster import KubeCluster, name_of


async def test_cordon_sets_unschedulable_and_the_annotation(kube_cluster: KubeCluster) -> None:
    name = name_of(kube_cluster.add_gpu_node(kube_cluster.unique("gpu")))
    runner = await runner_for(kube_cluster.kubeconfig)
    try:
        record = await runner.process(make_request("cordon", {}, entity_kind="node", entity_id=name, node=name))
    finally:
        await runner.close()
    assert record.outcome == "ok", record
    node = kube_cluster.sync_client().get(Node, name)
    assert node.spec is not None and node.spec.unschedulable is True
    assert node.metadata is not None and node.metadata.annotations is not None
    assert node.metadata.annotations[ANNOTATION].startswith("idle-gpu-2h 20")
    written = json.loads(node.metadata.annotations[CORDONED])  # what it changed, the rule, when
    assert written["rule"] == "idle-gpu-2h" and written["at"].startswith("20") and written["via"] == "cordon"
    assert written["previous"] == {"spec.unschedulable": None}


async def test_gpu_rule_cordons_the_gpus_node_and_uncordon_undoes_it(kube_cluster: KubeCluster) -> None:
    """Uncordon by another runner (a new store: nothing but the node's annotations to go by)."""
    name = kube_cluster.unique("gpu")
    kube_cluster.add_gpu_node(name)
    runner = await runner_for(kube_cluster.kubeconfig)
    client = kube_cluster.sync_client()
    try:
        await runner.process(make_request("cordon", {}, entity_id=f"{name}/gpu3", node=None))
        cordoned = client.get(Node, name)
        assert cordoned.spec is not None and cordoned.spec.unschedulable is True
    finally:
        await runner.close()
    runner = await runner_for(kube_cluster.kubeconfig)
    try:
        record = await runner.process(make_request("uncordon", {}, entity_id=f"{name}/gpu3", node=None))
    finally:
        await runner.close()
    assert record.outcome == "ok" and record.detail == f"node {name} uncordoned", (record.error, record.detail)
    node = client.get(Node, name)
    assert node.spec is not None and not node.spec.unschedulable
    assert node.metadata is not None and ANNOTATION not in (node.metadata.annotations or {})
    assert CORDONED not in (node.metadata.annotations or {})


async def test_uncordon_leaves_a_node_a_person_cordoned(kube_cluster: KubeCluster) -> None:
    name = kube_cluster.unique("gpu")
    before = kube_cluster.add_gpu_node(name, unschedulable=True)
    runner = await runner_for(kube_cluster.kubeconfig)
    try:
        record = await runner.process(make_request("uncordon", {}, entity_kind="node", entity_id=name, node=name))
    finally:
        await runner.close()
    assert record.outcome == "ok" and "not cordoned by gpuevents" in (record.detail or "")
    after = kube_cluster.sync_client().get(Node, name)
    assert after.spec is not None and after.spec.unschedulable is True
    assert after.metadata is not None and before.metadata is not None
    assert after.metadata.resourceVersion == before.metadata.resourceVersion, "the node was written to"


async def test_unknown_node_fails_without_retrying(kube_cluster: KubeCluster) -> None:
    runner = await runner_for(kube_cluster.kubeconfig)
    try:
        record = await runner.process(make_request("cordon", {}, entity_kind="node", entity_id="ghost",
                                                   node="ghost"))
    finally:
        await runner.close()
    assert record.outcome == "failed" and record.attempt == 1
    assert record.error is not None and '"ghost" not found' in record.error and "404" in record.error


async def test_api_5xx_is_retried(kube: FakeKubernetes, kubeconfig: Path) -> None:
    """A 503 on demand is what a real API server will not give: the stand-in answers it, as a Status."""
    kube.add_node("n1")
    kube.inject.append(Injected(503))
    runner = await runner_for(kubeconfig)
    try:
        record = await runner.process(make_request("cordon", {}, entity_kind="node", entity_id="n1"))
    finally:
        await runner.close()
    assert record.outcome == "ok" and record.attempt == 2
    assert kube.nodes["n1"]["spec"]["unschedulable"] is True
