"""The Kubernetes test control plane itself (tests/kube_cluster.py): GPUs are scheduled as capacity, a cordon is
honoured, kwok runs what is placed, a ServiceAccount client is who it says."""

from __future__ import annotations

import contextlib

from lightkube import ApiError, Client, KubeConfig
from lightkube.models.core_v1 import Container, PodCondition, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod

from tests.kube_cluster import KubeCluster


def gpu_pod(name: str, namespace: str, gpus: int) -> Pod:
    return Pod(metadata=ObjectMeta(name=name, namespace=namespace), spec=PodSpec(containers=[Container(
        name="c", image="c:1", resources=ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}))]))


def test_gpus_are_scheduled_as_node_capacity_and_a_cordon_is_honoured(kube_cluster: KubeCluster) -> None:
    ns = kube_cluster.namespace("sched")
    node = kube_cluster.unique("gpu")
    kube_cluster.add_gpu_node(node, gpus=2, labels={"pool": ns})
    with contextlib.closing(kube_cluster.sync_client()) as c:
        for name, gpus in (("fits", 2), ("too-big", 64)):
            pod = gpu_pod(name, ns, gpus)
            assert pod.spec is not None
            pod.spec.nodeSelector = {"pool": ns}
            c.create(pod)

        def phase(name: str) -> tuple[str | None, str | None]:
            p = c.get(Pod, name, namespace=ns)
            return (p.spec.nodeName if p.spec else None), (p.status.phase if p.status else None)

        assert kube_cluster.wait(lambda: phase("fits") == (node, "Running"), 30, "the 2-GPU pod running")
        def unschedulable(name: str) -> list[PodCondition]:
            status = c.get(Pod, name, namespace=ns).status
            return [x for x in (status.conditions if status else None) or [] if x.reason == "Unschedulable"]

        conditions = kube_cluster.wait(lambda: unschedulable("too-big"), 30, "the 64-GPU pod found unschedulable")
        assert "nvidia.com/gpu" in (conditions[0].message or "")
        c.patch(Node, node, {"spec": {"unschedulable": True}})
        late = gpu_pod("late", ns, 0)
        assert late.spec is not None
        late.spec.nodeSelector = {"pool": ns}
        c.create(late)
        kube_cluster.wait(lambda: unschedulable("late"), 30, "no place on a cordoned node")
        assert phase("late") == (None, "Pending")


def test_a_service_account_client_acts_as_that_account(kube_cluster: KubeCluster) -> None:
    ns = kube_cluster.namespace("sa")
    with contextlib.closing(kube_cluster.sync_client()) as admin:
        admin.create(gpu_pod("p", ns, 0))
    as_sa = Client(config=KubeConfig.from_file(kube_cluster.service_account_kubeconfig(ns, "nobody")), trust_env=False)
    try:
        as_sa.get(Pod, "p", namespace=ns)
    except ApiError as e:
        assert e.status.code == 403
        assert f"system:serviceaccount:{ns}:nobody" in (e.status.message or "")
    else:
        raise AssertionError("a ServiceAccount without RBAC read a pod")
