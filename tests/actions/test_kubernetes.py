"""cordon, uncordon, scale and cancel's pod delete through lightkube against a real Kubernetes control plane
(tests/kube_cluster.py); the API server's 5xx, which a real one does not answer on demand, against the stand-in."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from lightkube import ApiError, AsyncClient
from lightkube.models.apps_v1 import DeploymentSpec, StatefulSetSpec
from lightkube.models.core_v1 import Container, PodSpec, PodTemplateSpec, ResourceRequirements
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apps_v1 import Deployment, ReplicaSet, StatefulSet
from lightkube.resources.core_v1 import Node, Pod

from actions.builtin.cordon import ANNOTATION
from actions.runner import ActionRunner
from tests.actions.conftest import make_config, make_request
from tests.actions.fakes import FakeKubernetes, Injected
from tests.kube_cluster import KubeCluster
from tests.waiting import wait_for


def runner_for(kubeconfig: Path) -> ActionRunner:
    return ActionRunner(None, make_config(actions={"kubernetes": {"kubeconfig": str(kubeconfig)}}))


def gpu_pod_spec(node: str | None = None) -> PodSpec:
    return PodSpec(nodeName=node, containers=[Container(
        name="train", image="trainer:1", resources=ResourceRequirements(limits={"nvidia.com/gpu": "1"}))])


def gpu_pod_template(app: str) -> PodTemplateSpec:
    return PodTemplateSpec(metadata=ObjectMeta(labels={"app": app}), spec=gpu_pod_spec())


async def replica_sets_of(client: AsyncClient, namespace: str, app: str) -> list[ReplicaSet]:
    return [rs async for rs in client.list(ReplicaSet, namespace=namespace, labels={"app": app})]


async def running_pods(client: AsyncClient, namespace: str, app: str) -> int:
    return len([p async for p in client.list(Pod, namespace=namespace, labels={"app": app})
                if p.status is not None and p.status.phase == "Running" and p.metadata is not None
                and p.metadata.deletionTimestamp is None])


def running(client: AsyncClient, namespace: str, app: str, n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await running_pods(client, namespace, app) == n
    return check


async def test_cordon_sets_unschedulable_and_the_annotation(kube_cluster: KubeCluster) -> None:
    name = kube_cluster.add_gpu_node(kube_cluster.unique("gpu")).metadata.name  # type: ignore[union-attr]
    runner = runner_for(kube_cluster.kubeconfig)
    try:
        record = await runner.process(make_request("cordon", {}, entity_kind="node", entity_id=name, node=name))
    finally:
        await runner.close()
    assert record.outcome == "ok", record
    node = kube_cluster.sync_client().get(Node, name)
    assert node.spec is not None and node.spec.unschedulable is True
    assert node.metadata is not None and node.metadata.annotations is not None
    assert node.metadata.annotations[ANNOTATION].startswith("idle-gpu-2h 20")


async def test_gpu_rule_cordons_the_gpus_node_and_uncordon_undoes_it(kube_cluster: KubeCluster) -> None:
    name = kube_cluster.unique("gpu")
    kube_cluster.add_gpu_node(name)
    runner = runner_for(kube_cluster.kubeconfig)
    client = kube_cluster.sync_client()
    try:
        await runner.process(make_request("cordon", {}, entity_id=f"{name}/gpu3", node=None))
        cordoned = client.get(Node, name)
        assert cordoned.spec is not None and cordoned.spec.unschedulable is True
        record = await runner.process(make_request("uncordon", {}, entity_id=f"{name}/gpu3", node=None))
    finally:
        await runner.close()
    assert record.outcome == "ok" and record.detail == f"node {name} uncordoned", (record.error, record.detail)
    node = client.get(Node, name)
    assert node.spec is not None and not node.spec.unschedulable
    assert node.metadata is not None and ANNOTATION not in (node.metadata.annotations or {})


async def test_uncordon_leaves_a_node_a_person_cordoned(kube_cluster: KubeCluster) -> None:
    name = kube_cluster.unique("gpu")
    before = kube_cluster.add_gpu_node(name, unschedulable=True)
    runner = runner_for(kube_cluster.kubeconfig)
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
    runner = runner_for(kube_cluster.kubeconfig)
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
    runner = runner_for(kubeconfig)
    try:
        record = await runner.process(make_request("cordon", {}, entity_kind="node", entity_id="n1"))
    finally:
        await runner.close()
    assert record.outcome == "ok" and record.attempt == 2
    assert kube.nodes["n1"]["spec"]["unschedulable"] is True


async def test_scale_to_zero_then_previous_restores_three(kube_cluster: KubeCluster) -> None:
    ns = kube_cluster.namespace("ml")
    kube_cluster.add_gpu_node(kube_cluster.unique("gpu"), gpus=4)
    client = kube_cluster.client()
    await client.create(Deployment(metadata=ObjectMeta(name="notebook", namespace=ns), spec=DeploymentSpec(
        replicas=3, selector=LabelSelector(matchLabels={"app": "notebook"}), template=gpu_pod_template("notebook"))))
    await wait_for(running(client, ns, "notebook", 3), timeout=60, what="3 notebook pods running")
    runner = runner_for(kube_cluster.kubeconfig)
    target = {"kind": "Deployment", "namespace": ns, "name": "notebook"}
    try:
        down = await runner.process(make_request("scale", {**target, "replicas": 0}, entity_kind="node",
                                                 entity_id="n1", rule="weekend-down"))
        assert down.outcome == "ok" and down.detail == f"Deployment {ns}/notebook scaled from 3 to 0"

        async def scaled_down() -> bool:  # the controller-manager follows: the ReplicaSet, then its pods
            rss = await replica_sets_of(client, ns, "notebook")
            return [rs.spec.replicas for rs in rss if rs.spec] == [0] and await running(client, ns, "notebook", 0)()

        await wait_for(scaled_down, timeout=60, what="the ReplicaSet at 0 and no pod left")
        up = await runner.process(make_request("scale", {**target, "replicas": "previous"},
                                               entity_kind="node", entity_id="n1", rule="weekend-down"))
        assert up.outcome == "ok" and up.detail == f"Deployment {ns}/notebook scaled from 0 to 3"
        await wait_for(running(client, ns, "notebook", 3), timeout=60, what="3 notebook pods running again")
    finally:
        await runner.close()
        await client.close()


async def test_previous_without_an_earlier_scale_fails(kube_cluster: KubeCluster) -> None:
    ns = kube_cluster.namespace("ml")
    client = kube_cluster.client()
    await client.create(StatefulSet(metadata=ObjectMeta(name="db", namespace=ns), spec=StatefulSetSpec(
        replicas=2, selector=LabelSelector(matchLabels={"app": "db"}), template=gpu_pod_template("db"))))
    runner = runner_for(kube_cluster.kubeconfig)
    try:
        record = await runner.process(make_request("scale", {"kind": "StatefulSet", "namespace": ns,
                                                             "name": "db", "replicas": "previous"}))
        sts = await client.get(StatefulSet, "db", namespace=ns)
    finally:
        await runner.close()
        await client.close()
    assert record.outcome == "failed" and f"has not scaled StatefulSet {ns}/db before" in (record.error or "")
    assert sts.spec is not None and sts.spec.replicas == 2


async def test_statefulset_scales_through_its_own_subresource(kube_cluster: KubeCluster) -> None:
    ns = kube_cluster.namespace("ml")
    client = kube_cluster.client()
    await client.create(StatefulSet(metadata=ObjectMeta(name="db", namespace=ns), spec=StatefulSetSpec(
        replicas=2, selector=LabelSelector(matchLabels={"app": "db"}), template=gpu_pod_template("db"))))
    runner = runner_for(kube_cluster.kubeconfig)
    try:
        record = await runner.process(make_request("scale", {"kind": "StatefulSet", "namespace": ns,
                                                             "name": "db", "replicas": 5}))
        scale = await client.get(StatefulSet.Scale, "db", namespace=ns)
    finally:
        await runner.close()
        await client.close()
    assert record.outcome == "ok" and record.detail == f"StatefulSet {ns}/db scaled from 2 to 5"
    assert scale.spec is not None and scale.spec.replicas == 5


async def test_cancel_deletes_the_pod_of_a_kubernetes_job(kube_cluster: KubeCluster) -> None:
    ns = kube_cluster.namespace("ml")
    node = kube_cluster.add_gpu_node(kube_cluster.unique("gpu")).metadata.name  # type: ignore[union-attr]
    client = kube_cluster.client()
    await client.create(Pod(metadata=ObjectMeta(name="train-0", namespace=ns, labels={"app": "train"}),
                            spec=gpu_pod_spec(node)))
    await wait_for(running(client, ns, "train", 1), timeout=30, what="the pod running (kwok)")
    runner = runner_for(kube_cluster.kubeconfig)

    async def gone() -> bool:
        try:
            await client.get(Pod, "train-0", namespace=ns)
        except ApiError as e:
            return e.status.code == 404
        return False

    try:
        record = await runner.process(make_request(
            "cancel", {"provider": "kubernetes"}, entity_kind="process", entity_id=f"{node}/pid/4242",
            facts={"process": {"pid": 4242, "user": "alice", "job": "train", "pod": f"{ns}/train-0"}}))
        assert record.outcome == "ok" and record.detail == f"pod {ns}/train-0 deleted", record
        await wait_for(gone, timeout=30, what="the pod deleted")
    finally:
        await runner.close()
        await client.close()
