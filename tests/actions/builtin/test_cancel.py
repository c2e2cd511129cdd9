"""cancel on Kubernetes against a real control plane: the pod of a Kubernetes job is deleted."""

from __future__ import annotations

from lightkube import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from tests.actions.builtin.kube_objects import gpu_pod_spec, runner_for, running
from tests.actions.conftest import make_request
from tests.kube_cluster import KubeCluster, name_of
from tests.waiting import wait_for


async def test_cancel_deletes_the_pod_of_a_kubernetes_job(kube_cluster: KubeCluster) -> None:
    ns = kube_cluster.namespace("ml")
    node = name_of(kube_cluster.add_gpu_node(kube_cluster.unique("gpu")))
    client = kube_cluster.client()
    await client.create(Pod(metadata=ObjectMeta(name="train-0", namespace=ns, labels={"app": "train"}),
                            spec=gpu_pod_spec(node)))
    await wait_for(running(client, ns, "train", 1), timeout=30, what="the pod running (kwok)")
    runner = await runner_for(kube_cluster.kubeconfig)

    async def gone() -> bool:
        try:
            await client.get(Pod, "train-0", namespace=ns)
        except ApiError as e:
            return e.status.code == 404
        return False

    try:
        record = await runner.process(make_request(
            "cancel", {"provider": "kubernetes"}, entity_kind="process", entity_id=f"{node}/pid/4242", node=node,
            facts={"process": {"pid": 4242, "user": "alice", "job": "train", "pod": f"{ns}/train-0"}}))
        assert record.outcome == "ok" and record.detail == f"pod {ns}/train-0 deleted", record
        await wait_for(gone, timeout=30, what="the pod deleted")
    finally:
        await runner.close()
        await client.close()
