"""scale through lightkube against a real Kubernetes control plane: to zero and back to the previous count,
`previous` with nothing to go back to, a StatefulSet, and `previous` from the workload's annotation alone."""

from __future__ import annotations

from lightkube.models.apps_v1 import DeploymentSpec, StatefulSetSpec
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apps_v1 import Deployment, StatefulSet

from actions.builtin.scale import SCALED
from tests.actions.builtin.kube_objects import gpu_pod_template, replica_sets_of, runner_for, running
from tests.actions.conftest import make_request
from tests.kube_cluster import KubeCluster
from tests.waiting import wait_for


async def test_scale_to_zero_then_previous_restores_three(kube_cluster: KubeCluster) -> None:
    ns = kube_cluster.namespace("ml")
    kube_cluster.add_gpu_node(kube_cluster.unique("gpu"), gpus=4)
    client = kube_cluster.client()
    await client.create(Deployment(metadata=ObjectMeta(name="notebook", namespace=ns), spec=DeploymentSpec(
        replicas=3, selector=LabelSelector(matchLabels={"app": "notebook"}), template=gpu_pod_template("notebook"))))
    await wait_for(running(client, ns, "notebook", 3), timeout=60, what="3 notebook pods running")
    runner = await runner_for(kube_cluster.kubeconfig)
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
    runner = await runner_for(kube_cluster.kubeconfig)
    try:
        record = await runner.process(make_request("scale", {"kind": "StatefulSet", "namespace": ns,
                                                             "name": "db", "replicas": "previous"}))
        sts = await client.get(StatefulSet, "db", namespace=ns)
    finally:
        await runner.close()
        await client.close()
    assert record.outcome == "failed" and f"has not scaled StatefulSet {ns}/db before" in (record.error or "")
    assert sts.spec is not None and sts.spec.replicas == 2


async def test_a_statefulset_scales(kube_cluster: KubeCluster) -> None:
    ns = kube_cluster.namespace("ml")
    client = kube_cluster.client()
    await client.create(StatefulSet(metadata=ObjectMeta(name="db", namespace=ns), spec=StatefulSetSpec(
        replicas=2, selector=LabelSelector(matchLabels={"app": "db"}), template=gpu_pod_template("db"))))
    runner = await runner_for(kube_cluster.kubeconfig)
    try:
        record = await runner.process(make_request("scale", {"kind": "StatefulSet", "namespace": ns,
                                                             "name": "db", "replicas": 5}))
        scale = await client.get(StatefulSet, "db", namespace=ns)
    finally:
        await runner.close()
        await client.close()
    assert record.outcome == "ok" and record.detail == f"StatefulSet {ns}/db scaled from 2 to 5"
    assert scale.spec is not None and scale.spec.replicas == 5


async def test_previous_restores_from_the_workloads_annotation_with_an_empty_store(kube_cluster: KubeCluster) -> None:
    """The count before is written on the workload with the rule and the time; a runner whose KV is new (the
    engine's store is gone) still restores it, and the annotation goes with the restore."""
    ns = kube_cluster.namespace("ml")
    client = kube_cluster.client()
    await client.create(Deployment(metadata=ObjectMeta(name="nb", namespace=ns), spec=DeploymentSpec(
        replicas=3, selector=LabelSelector(matchLabels={"app": "nb"}), template=gpu_pod_template("nb"))))
    target = {"kind": "Deployment", "namespace": ns, "name": "nb"}
    try:
        for replicas in (0, "previous"):
            runner = await runner_for(kube_cluster.kubeconfig)  # a new MemoryKv each time
            try:
                record = await runner.process(make_request("scale", {**target, "replicas": replicas},
                                                           rule="weekend-down"))
            finally:
                await runner.close()
            assert record.outcome == "ok", record
            got = await client.get(Deployment, "nb", namespace=ns)
            annotations = (got.metadata.annotations if got.metadata else None) or {}
            if replicas == 0:
                assert got.spec is not None and got.spec.replicas == 0
                assert '"replicas":3' in annotations[SCALED] and '"rule":"weekend-down"' in annotations[SCALED]
        assert got.spec is not None and got.spec.replicas == 3 and SCALED not in annotations
    finally:
        await client.close()
