"""The chart's objects on a real API server (tests/kube_cluster.py): the namespace it creates carries the Pod
Security label the agent needs, so the agent's pod is admitted there and refused where the level is stricter."""

from __future__ import annotations

import contextlib
import subprocess
from typing import Any

import pytest
import yaml
from lightkube import ApiError, codecs

from tests.deploy.test_helm import CHART, helm  # noqa: F401 - the fixture
from tests.kube_cluster import KubeCluster


def _rendered(helm: str, namespace: str, *sets: str) -> list[dict[str, Any]]:  # noqa: F811
    args = [a for s in sets for a in ("--set", s)]
    out = subprocess.run([helm, "template", "gpuevents", str(CHART), "--namespace", namespace, *args],
                         capture_output=True, text=True, timeout=60, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _agent_pod(docs: list[dict[str, Any]], namespace: str) -> dict[str, Any]:
    (agent,) = [d for d in docs if d["kind"] == "DaemonSet"]
    template = agent["spec"]["template"]
    # what Pod Security judges (hostPID, capabilities, host paths) as written; no RuntimeClass or account to look up
    spec = {k: v for k, v in template["spec"].items() if k not in ("runtimeClassName", "serviceAccountName")}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agent-probe", "namespace": namespace,
                                                            "labels": template["metadata"]["labels"]},
            "spec": {**spec, "nodeName": "nowhere", "automountServiceAccountToken": False}}


def test_the_agent_is_admitted_in_the_namespace_the_chart_creates_and_refused_without_its_label(
        kube_cluster: KubeCluster, helm: str) -> None:  # noqa: F811
    namespace = kube_cluster.unique("gpuevents")
    docs = _rendered(helm, namespace, "namespace.create=true")
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    with contextlib.closing(kube_cluster.sync_client()) as admin:
        admin.create(codecs.from_dict(ns))
        admin.create(codecs.from_dict(_agent_pod(docs, namespace)), dry_run=True)  # admitted: no error

        strict = kube_cluster.unique("baseline")
        admin.create(codecs.from_dict({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": strict, "labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}))
        with pytest.raises(ApiError) as refused:
            admin.create(codecs.from_dict(_agent_pod(docs, strict)), dry_run=True)
    assert refused.value.status.code == 403 and "PodSecurity" in (refused.value.status.message or "")
    assert "hostPID" in (refused.value.status.message or "")


def _runner_pod(docs: list[dict[str, Any]], namespace: str, name: str, node: str) -> dict[str, Any]:
    (runner,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpuevents-runner"]
    spec = {k: v for k, v in runner["spec"]["template"]["spec"].items() if k != "serviceAccountName"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {**spec, "automountServiceAccountToken": False, "tolerations": [{"operator": "Exists"}],
                     "nodeSelector": {"kubernetes.io/hostname": node}}}


def test_the_scheduler_keeps_the_runner_off_gpu_nodes(kube_cluster: KubeCluster, helm: str) -> None:  # noqa: F811
    """Pinned to a GPU node the chart's runner pod stays unschedulable (its node affinity); pinned to another
    node it is scheduled. Without the affinity the first would run on the GPU node."""
    gpu = kube_cluster.unique("gpu")
    kube_cluster.add_gpu_node(gpu, labels={"nvidia.com/gpu.present": "true"})
    cpu = kube_cluster.unique("cpu")
    kube_cluster.add_gpu_node(cpu, gpus=0)
    namespace = kube_cluster.namespace("gpuevents")
    docs = _rendered(helm, namespace)
    with contextlib.closing(kube_cluster.sync_client()) as admin:
        for name, node in (("on-gpu", gpu), ("on-cpu", cpu)):
            admin.create(codecs.from_dict(_runner_pod(docs, namespace, name, node)))

        def scheduled(name: str) -> tuple[str, str] | None:
            from lightkube.resources.core_v1 import Pod

            pod = admin.get(Pod, name, namespace=namespace)
            conditions = (pod.status.conditions if pod.status else None) or []
            got = next((c for c in conditions if c.type == "PodScheduled"), None)
            return (got.status, got.reason or "") if got is not None else None

        assert kube_cluster.wait(lambda: scheduled("on-cpu"), 60, "the pod on the CPU node scheduled") == (
            "True", "")
        status, reason = kube_cluster.wait(lambda: scheduled("on-gpu"), 60, "the scheduler's verdict on the GPU node")
    assert (status, reason) == ("False", "Unschedulable")
