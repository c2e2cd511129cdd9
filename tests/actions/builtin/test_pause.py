"""pause and resume against a real control plane (tests/kube_cluster.py): each kind stopped its own way and set
back exactly, CRD kinds through their CRDs, an Event on the workload, the identity and protection refusals, and
a kind pause does not know paused by the nearest owner below it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client, codecs
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Event, Pod

from actions.builtin.pause import PAUSED_BY
from actions.runner import ActionRunner
from actions.store import MemoryKv
from gpuevents.kubekinds import KINDS
from gpuevents.records import AuditRecord
from tests.actions.conftest import make_config, make_request
from tests.kube_cluster import KubeCluster, meta, name_of

KV = MemoryKv()  # what pause remembers outlives each runner, as the engine's KV bucket does
POD_SPEC: dict[str, Any] = {"containers": [{"name": "main", "image": "trainer:1", "resources": {
    "limits": {"nvidia.com/gpu": "1"}}}], "tolerations": [{"operator": "Exists"}]}


@pytest.fixture
def api(kube_cluster: KubeCluster) -> Iterator[Client]:
    with contextlib.closing(kube_cluster.sync_client()) as c:
        yield c


def crd(api: Client, cluster: KubeCluster, group: str, version: str, kind: str, plural: str) -> None:
    """A CustomResourceDefinition that keeps whatever it is given, once Established."""
    name = f"{plural}.{group}"
    with contextlib.suppress(Exception):  # made by an earlier test of the session
        api.create(codecs.from_dict({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": name},
            "spec": {"group": group, "scope": "Namespaced", "names": {"kind": kind, "plural": plural,
                                                                      "singular": kind.lower()},
                     "versions": [{"name": version, "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}))

    def established() -> bool:
        got = api.get(CustomResourceDefinition, name)
        conditions = (got.status.conditions if got.status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    cluster.wait(established, 30, f"CRD {name} established")


def create(api: Client, obj: dict[str, Any]) -> Any:
    kind = KINDS[obj["kind"]]
    if kind.group not in ("", "apps", "batch"):
        create_namespaced_resource(kind.group, kind.version, kind.kind, kind.plural)
    return api.create(codecs.from_dict(obj))


def get(api: Client, kind: str, ns: str, name: str) -> dict[str, Any]:
    from gpuevents.kube import resource_for

    k = KINDS[kind]
    obj: dict[str, Any] = api.get(resource_for(k.api_version, k.kind), name, namespace=ns).to_dict()
    return obj


async def run(cluster: KubeCluster, type_: str, job: str, facts: dict[str, Any] | None = None,
              **config: Any) -> AuditRecord:
    runner = await ActionRunner.open(None, make_config(actions={"kubernetes": {"kubeconfig": str(cluster.kubeconfig)}},
                                                       **config), kv=KV)
    try:
        return await runner.process(make_request(type_, {}, entity_kind="job", entity_id=f"job/kubernetes/{job}",
                                                 node=None, facts={"job": {"id": job, "scheduler": "kubernetes",
                                                                           **(facts or {})}}))
    finally:
        await runner.close()


def events(api: Client, ns: str, name: str) -> list[str]:
    return [e.reason or "" for e in api.list(Event, namespace=ns) if e.involvedObject.name == name]


def deployment(ns: str, name: str, replicas: int | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": name}},
                            "template": {"metadata": {"labels": {"app": name}}, "spec": POD_SPEC}}
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns}, "spec": spec}


CASES: list[tuple[str, list[str], Any, Any, dict[str, Any]]] = [
    ("Deployment", ["spec", "replicas"], 3, 0, {"replicas": 3, "selector": {"matchLabels": {"app": "x"}},
                                                "template": {"metadata": {"labels": {"app": "x"}}, "spec": POD_SPEC}}),
    ("StatefulSet", ["spec", "replicas"], 2, 0, {"replicas": 2, "serviceName": "x",
                                                 "selector": {"matchLabels": {"app": "x"}},
                                                 "template": {"metadata": {"labels": {"app": "x"}}, "spec": POD_SPEC}}),
    ("Job", ["spec", "suspend"], False, True, {"suspend": False, "template": {"spec": {**POD_SPEC,
                                                                                      "restartPolicy": "Never"}}}),
    # CronJob: the API server defaults spec.suspend to false, and that is what resume sets back
    ("CronJob", ["spec", "suspend"], False, True, {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": {
        "spec": {**POD_SPEC, "restartPolicy": "Never"}}}}}),
    ("JobSet", ["spec", "suspend"], None, True, {"replicatedJobs": []}),
    ("RayCluster", ["spec", "suspend"], False, True, {"suspend": False, "headGroupSpec": {}}),
    ("PyTorchJob", ["spec", "runPolicy", "suspend"], None, True, {"runPolicy": {}, "pytorchReplicaSpecs": {}}),
    ("Notebook", ["metadata", "annotations", "kubeflow-resource-stopped"], None, "2", {"template": {}}),
]


@pytest.mark.parametrize(("kind", "path", "before", "after", "spec"), CASES, ids=[c[0] for c in CASES])
async def test_pause_stops_each_kind_its_way_and_resume_sets_it_back(
        kube_cluster: KubeCluster, api: Client, kind: str, path: list[str], before: Any, after: Any,
        spec: dict[str, Any]) -> None:
    k = KINDS[kind]
    if k.group not in ("apps", "batch"):
        crd(api, kube_cluster, k.group, k.version, k.kind, k.plural)
    ns = kube_cluster.namespace("pause")
    create(api, {"apiVersion": k.api_version, "kind": kind, "metadata": {"name": "w", "namespace": ns},
                 "spec": spec})
    obj = get(api, kind, ns, "w")
    job = f"{ns}/{kind}/w"
    record = await run(kube_cluster, "pause", job, {"controller_uid": obj["metadata"]["uid"]})
    assert record.outcome == "ok", record
    paused = get(api, kind, ns, "w")
    value: Any = paused
    for p in path:
        value = value.get(p) if isinstance(value, dict) else None
    assert value is not None and (value == after or (kind == "Notebook" and value.startswith("20")))
    assert PAUSED_BY in paused["metadata"]["annotations"]
    assert "GpueventsPaused" in events(api, ns, "w")
    again = await run(kube_cluster, "pause", job)
    assert again.outcome == "ok" and "paused already" in (again.detail or "")

    record = await run(kube_cluster, "resume", job)
    assert record.outcome == "ok", record
    resumed = get(api, kind, ns, "w")
    value = resumed
    for p in path:
        value = value.get(p) if isinstance(value, dict) else None
    assert value == before
    assert PAUSED_BY not in (resumed["metadata"].get("annotations") or {})
    assert "GpueventsResumed" in events(api, ns, "w")


async def test_a_deployment_left_at_its_default_count_is_restored_to_it(kube_cluster: KubeCluster,
                                                                       api: Client) -> None:
    ns = kube_cluster.namespace("pause")
    api.create(codecs.from_dict(deployment(ns, "d", None)))
    assert (await run(kube_cluster, "pause", f"{ns}/Deployment/d")).outcome == "ok"
    assert api.get(Deployment, "d", namespace=ns).spec.replicas == 0
    api.patch(Deployment, "d", {"metadata": {"labels": {"touched": "yes"}}}, namespace=ns)  # not the count
    assert (await run(kube_cluster, "resume", f"{ns}/Deployment/d")).outcome == "ok"
    assert api.get(Deployment, "d", namespace=ns).spec.replicas == 1


async def test_resume_leaves_a_count_a_person_set_since(kube_cluster: KubeCluster, api: Client) -> None:
    ns = kube_cluster.namespace("pause")
    api.create(codecs.from_dict(deployment(ns, "d", 4)))
    await run(kube_cluster, "pause", f"{ns}/Deployment/d")
    api.patch(Deployment, "d", {"spec": {"replicas": 2}}, namespace=ns)
    record = await run(kube_cluster, "resume", f"{ns}/Deployment/d")
    assert record.outcome == "ok" and "left as it is" in (record.detail or "")
    assert api.get(Deployment, "d", namespace=ns).spec.replicas == 2


async def test_an_owner_that_is_not_the_one_decided_on_is_refused(kube_cluster: KubeCluster, api: Client) -> None:
    ns = kube_cluster.namespace("pause")
    api.create(codecs.from_dict(deployment(ns, "d", 3)))
    d = api.get(Deployment, "d", namespace=ns)
    assert d.metadata is not None
    other_uid = await run(kube_cluster, "pause", f"{ns}/Deployment/d", {"controller_uid": "not-its-uid"})
    assert other_uid.outcome == "refused" and "created again" in (other_uid.detail or "")
    changed = await run(kube_cluster, "pause", f"{ns}/Deployment/d",
                        {"controller_uid": d.metadata.uid, "controller_generation": (d.metadata.generation or 0) - 1})
    assert changed.outcome == "refused" and "changed since the decision" in (changed.detail or "")
    assert api.get(Deployment, "d", namespace=ns).spec.replicas == 3


async def test_protected_namespaces_labels_bare_pods_and_dry_runs_change_nothing(
        kube_cluster: KubeCluster, api: Client) -> None:
    ns = kube_cluster.namespace("pause")
    dep = deployment(ns, "d", 3)
    dep["metadata"]["labels"] = {"tier": "prod"}
    api.create(codecs.from_dict(dep))
    r = await run(kube_cluster, "pause", f"{ns}/Deployment/d", protect={"namespaces": [ns]})
    assert r.outcome == "refused" and f"protected: namespace {ns}" in (r.error or "")
    r = await run(kube_cluster, "pause", f"{ns}/Deployment/d", protect={"workload_labels": {"tier": "prod"}})
    assert r.outcome == "refused" and "tier=prod" in (r.detail or "")
    r = await run(kube_cluster, "pause", f"{ns}/Deployment/d", engine={"dry_run": True})
    assert r.outcome == "dry_run"
    r = await run(kube_cluster, "pause", f"{ns}/Pod/scratch")
    assert r.outcome == "refused" and "no controller" in (r.detail or "")
    assert api.get(Deployment, "d", namespace=ns).spec.replicas == 3


async def test_a_kind_pause_does_not_know_is_paused_by_the_nearest_owner_below_it(
        kube_cluster: KubeCluster, api: Client) -> None:
    crd(api, kube_cluster, "acme.example.com", "v1", "Trainer", "trainers")
    kube_cluster.add_gpu_node(kube_cluster.unique("gpu"))
    ns = kube_cluster.namespace("pause")
    trainer_res = create_namespaced_resource("acme.example.com", "v1", "Trainer", "trainers")
    api.create(codecs.from_dict({"apiVersion": "acme.example.com/v1", "kind": "Trainer",
                                 "metadata": {"name": "t1", "namespace": ns}, "spec": {}}))
    t = api.get(trainer_res, "t1", namespace=ns)
    dep = deployment(ns, "t1-workers", 2)
    dep["metadata"]["ownerReferences"] = [{"apiVersion": "acme.example.com/v1", "kind": "Trainer", "name": "t1",
                                           "uid": meta(t).uid, "controller": True}]
    api.create(codecs.from_dict(dep))
    pods = kube_cluster.wait(lambda: [name_of(p) for p in api.list(Pod, namespace=ns)], 60, "the pods")
    r = await run(kube_cluster, "pause", f"{ns}/Trainer/t1", {"pods": pods})
    assert r.outcome == "ok", r
    assert "Deployment t1-workers" in (r.detail or "") and "cannot be paused" in (r.detail or "")
    assert api.get(Deployment, "t1-workers", namespace=ns).spec.replicas == 0
    no_pods = await run(kube_cluster, "pause", f"{ns}/Trainer/t1")
    assert no_pods.outcome == "refused" and "names no pod" in (no_pods.detail or "")


async def test_cancel_deletes_a_bare_pod_and_refuses_a_controllers_job(kube_cluster: KubeCluster,
                                                                       api: Client) -> None:
    ns = kube_cluster.namespace("cancel")
    api.create(codecs.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "scratch", "namespace": ns},
                                 "spec": POD_SPEC}))
    api.create(codecs.from_dict(deployment(ns, "d", 1)))
    runner = await ActionRunner.open(
        None, make_config(actions={"kubernetes": {"kubeconfig": str(kube_cluster.kubeconfig)}}))
    try:
        bare = await runner.process(make_request("cancel", {"provider": "kubernetes"}, entity_kind="job", node=None,
                                                 facts={"job": {"id": f"{ns}/Pod/scratch"}}))
        owned = await runner.process(make_request("cancel", {"provider": "kubernetes"}, entity_kind="job", node=None,
                                                  facts={"job": {"id": f"{ns}/Deployment/d"}}))
    finally:
        await runner.close()
    assert bare.outcome == "ok" and bare.detail == f"pod {ns}/scratch deleted"
    assert owned.outcome == "refused" and "`pause` stops it" in (owned.detail or "")
    kube_cluster.wait(lambda: not [p for p in api.list(Pod, namespace=ns) if name_of(p) == "scratch"], 30,
                      "the bare pod gone")
    assert "GpueventsCancelled" in events(api, ns, "scratch")


async def test_an_api_server_that_forbids_it_fails_the_pause_with_the_reason(kube_cluster: KubeCluster,
                                                                            api: Client) -> None:
    ns = kube_cluster.namespace("pause")
    api.create(codecs.from_dict(deployment(ns, "d", 2)))
    kubeconfig = kube_cluster.service_account_kubeconfig(ns, "nobody")  # a ServiceAccount with no rights
    runner = await ActionRunner.open(None, make_config(actions={"kubernetes": {"kubeconfig": str(kubeconfig)}}), kv=KV)
    try:
        record = await runner.process(make_request("pause", {}, entity_kind="job", node=None,
                                                   facts={"job": {"id": f"{ns}/Deployment/d"}}))
    finally:
        await runner.close()
    # a 403 is retried (rights are granted without a restart), and with no open incident only max_attempts times
    assert record.outcome == "failed" and record.attempt == 3
    assert record.error is not None and "gave up after 3 attempts" in record.error and "HTTP 403" in record.error
    assert "deployments" in record.error
    assert api.get(Deployment, "d", namespace=ns).spec.replicas == 2
