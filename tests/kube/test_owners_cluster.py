"""The agent's owner walk against a real control plane: the pods a Deployment's ReplicaSet and a Job started
(placed by the scheduler on a kwok GPU node) resolve to their top owner through lightkube, read-only; with a
ServiceAccount that may read pods and ReplicaSets only, the walk stops at the ReplicaSet and says why."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from lightkube import codecs
from lightkube.resources.core_v1 import Namespace, Pod

from agent.kubeapi import lightkube_fetch, open_fetch
from agent.kubeowners import Fetch, OwnerWalker
from gpuevents.config import KubernetesConfig
from gpuevents.config.kube import KubernetesJobsConfig
from tests.kube_cluster import KubeCluster, meta, name_of

POD_SPEC: dict[str, Any] = {"containers": [{"name": "main", "image": "trainer:1", "resources": {
    "limits": {"nvidia.com/gpu": "1"}}}], "tolerations": [{"operator": "Exists"}]}


def _setup(cluster: KubeCluster) -> tuple[str, list[str], list[str]]:
    cluster.add_gpu_node(cluster.unique("gpu"))
    ns = cluster.namespace("owners")
    with contextlib.closing(cluster.sync_client()) as api:
        api.patch(Namespace, ns, {"metadata": {"annotations": {"example.com/owner": "team-lead@example.com"}}})
        api.create(codecs.from_dict({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llm", "namespace": ns},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "llm"}},
                     "template": {"metadata": {"labels": {"app": "llm"}}, "spec": POD_SPEC}}}))
        api.create(codecs.from_dict({
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train", "namespace": ns,
                                                                  "annotations": {"example.com/owner": "erin"}},
            "spec": {"template": {"metadata": {"labels": {"job": "train"}},
                                  "spec": {**POD_SPEC, "restartPolicy": "Never"}}}}))

        def pods() -> tuple[list[str], list[str]] | None:
            got = list(api.list(Pod, namespace=ns))
            dep = [name_of(p) for p in got if (meta(p).labels or {}).get("app") == "llm"]
            job = [name_of(p) for p in got if (meta(p).labels or {}).get("job") == "train"]
            return (dep, job) if len(dep) == 2 and len(job) == 1 else None

        dep, job = cluster.wait(pods, 60, "the Deployment's and the Job's pods")
    return ns, dep, job


@pytest.mark.parametrize("reader", ["aiohttp", "lightkube"])
async def test_pods_resolve_to_their_top_owner_through_the_api(kube_cluster: KubeCluster, reader: str) -> None:
    ns, dep, job = _setup(kube_cluster)
    fetch: Fetch
    if reader == "aiohttp":  # the agent's own reader (a client certificate in this kubeconfig)
        fetch, close = open_fetch(KubernetesConfig(kubeconfig=kube_cluster.kubeconfig))
    else:
        client = kube_cluster.client()
        fetch, close = lightkube_fetch(client), client.close
    try:
        walker = OwnerWalker(fetch, KubernetesJobsConfig(user_annotation="example.com/owner"))
        jobs = await walker.resolve_all([f"{ns}/{p}" for p in [*dep, *job]])
        reads = walker.reads
        await walker.resolve_all([f"{ns}/{p}" for p in [*dep, *job]])
    finally:
        await close()
    ids = {j.id for j in jobs.values()}
    assert ids == {f"{ns}/Deployment/llm", f"{ns}/Job/train"}
    d = jobs[f"{ns}/{dep[0]}"]
    assert d.controller == "Deployment/llm" and d.chain[0].startswith("ReplicaSet/llm-")
    assert d.user == "team-lead@example.com"          # from the namespace
    assert jobs[f"{ns}/{job[0]}"].user == "erin"       # from the Job itself
    assert d.controller_uid and d.started_at is not None
    assert walker.reads == reads                       # the second pass read nothing


async def test_a_service_account_without_rights_on_deployments_stops_the_walk_at_the_replicaset(
        kube_cluster: KubeCluster) -> None:
    ns, dep, _ = _setup(kube_cluster)
    with contextlib.closing(kube_cluster.sync_client()) as api:
        api.create(codecs.from_dict({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "pods-and-rs", "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                      {"apiGroups": ["apps"], "resources": ["replicasets"], "verbs": ["get"]}]}))
        api.create(codecs.from_dict({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "agent", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods-and-rs"},
            "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": ns}]}))
    fetch, close = open_fetch(KubernetesConfig(kubeconfig=kube_cluster.service_account_kubeconfig(ns, "agent")))
    try:  # the agent's reader with a ServiceAccount token
        job = await OwnerWalker(fetch, KubernetesJobsConfig()).resolve(ns, dep[0])
    finally:
        await close()
    assert job is not None and job.id.startswith(f"{ns}/ReplicaSet/llm-")
    assert job.stopped_short is not None and "403" in job.stopped_short
