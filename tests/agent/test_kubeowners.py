"""A pod's job is its top owner: walked through controller ownerReferences (Deployment via ReplicaSet, CronJob via
Job, CRD kinds), cached per owner uid, stopping at what the API will not give; user from the configured
annotation or label of the pod, its owner, then its namespace; the core publishes one job per owner."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from agent.core import NodeCore
from agent.inputs import NodeInputs
from agent.kubeowners import Meta, OwnerWalker, Unreadable, meta_of
from agent.podalloc import PodAllocation
from agent.sample import GpuReading, NodeReading, ProcessIdentity, ProcReading
from gpuevents.config import ThresholdsConfig
from gpuevents.config.kube import KubernetesJobsConfig

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def obj(api_version: str, kind: str, name: str, uid: str, owner: tuple[str, str, str, str] | None = None,
        ns: str = "team-a", **md: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": uid, "generation": 3,
                            "creationTimestamp": "2026-12-03T08:00:00Z", **md}
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Other", "name": "not-the-controller", "uid": "x"},
            {"apiVersion": owner[0], "kind": owner[1], "name": owner[2], "uid": owner[3], "controller": True}]
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "status": {"startTime": "2026-12-03T08:01:00Z"}}


class Api:
    """Objects by (kind, namespace, name); kinds in `forbidden` answer as a 403 would."""

    def __init__(self, *objects: dict[str, Any], forbidden: tuple[str, ...] = ()) -> None:
        self.objects = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objects}
        self.forbidden = forbidden
        self.reads: list[str] = []

    async def __call__(self, api_version: str, kind: str, namespace: str, name: str) -> Meta | None:
        self.reads.append(f"{kind}/{name}")
        if kind in self.forbidden:
            raise Unreadable(f"HTTP 403 Forbidden: {kind.lower()}s is forbidden")
        o = self.objects.get((kind, namespace, name))
        return meta_of(o, api_version, kind) if o else None


def deployment_api(**kw: Any) -> Api:
    return Api(
        obj("v1", "Pod", "llm-7d9-abc", "p1", ("apps/v1", "ReplicaSet", "llm-7d9", "rs1"),
            annotations={"gpuevents.io/keep-until": "2026-12-04T00:00:00Z"}),
        obj("v1", "Pod", "llm-7d9-def", "p2", ("apps/v1", "ReplicaSet", "llm-7d9", "rs1")),
        obj("apps/v1", "ReplicaSet", "llm-7d9", "rs1", ("apps/v1", "Deployment", "llm", "d1")),
        obj("apps/v1", "Deployment", "llm", "d1", labels={"team": "nlp"},
            annotations={"example.com/owner": "alice@example.com"}),
        obj("v1", "Namespace", "team-a", "n1", ns="", labels={"owner": "bob"},
            annotations={"gpuevents.io/exclude": "until=2027-01-01T00:00:00Z", "other": "not carried"}),
        **kw)


async def test_a_deployments_pods_are_one_job_walked_through_its_replicaset() -> None:
    api = deployment_api()
    walker = OwnerWalker(api, KubernetesJobsConfig(user_annotation="example.com/owner", user_label="owner"))
    jobs = await walker.resolve_all(["team-a/llm-7d9-abc", "team-a/llm-7d9-def"])
    a, b = jobs["team-a/llm-7d9-abc"], jobs["team-a/llm-7d9-def"]
    assert a.id == b.id == "team-a/Deployment/llm"
    assert a.controller == "Deployment/llm" and a.controller_uid == "d1" and a.controller_generation == 3
    assert a.chain == ("ReplicaSet/llm-7d9", "Deployment/llm")
    assert a.user == "alice@example.com"             # the owner's annotation, before the namespace's label
    assert a.labels == {"team": "nlp"}
    assert a.annotations["gpuevents.io/keep-until"] == "2026-12-04T00:00:00Z"   # the pod's
    assert a.annotations["gpuevents.io/exclude"] == "until=2027-01-01T00:00:00Z"  # the namespace's gpuevents.io/
    assert "other" not in a.annotations
    assert a.started_at == datetime(2026, 12, 3, 8, 1, tzinfo=UTC)
    # the ReplicaSet and Deployment were read once for both pods (cached by uid), the namespace once
    assert api.reads.count("ReplicaSet/llm-7d9") == 1 and api.reads.count("Deployment/llm") == 1
    assert api.reads.count("Namespace/team-a") == 1
    before = len(api.reads)
    await walker.resolve_all(["team-a/llm-7d9-abc", "team-a/llm-7d9-def"])
    assert len(api.reads) == before  # never per sample


async def test_the_user_falls_back_to_the_namespace_and_a_bare_pod_is_its_own_job() -> None:
    api = Api(obj("v1", "Pod", "scratch", "p9"), obj("v1", "Namespace", "team-a", "n1", ns="", labels={"owner": "bob"}))
    job = await OwnerWalker(api, KubernetesJobsConfig(user_label="owner")).resolve("team-a", "scratch")
    assert job is not None and job.id == "team-a/Pod/scratch" and job.controller is None and job.user == "bob"


async def test_crd_kinds_and_cronjobs_walk_to_the_top() -> None:
    api = Api(
        obj("v1", "Pod", "w-0", "p1", ("batch/v1", "Job", "w-2912", "j1")),
        obj("batch/v1", "Job", "w-2912", "j1", ("batch/v1", "CronJob", "nightly", "c1")),
        obj("batch/v1", "CronJob", "nightly", "c1"),
        obj("v1", "Pod", "t-0", "p2", ("batch/v1", "Job", "ts-workers-0", "j2")),
        obj("batch/v1", "Job", "ts-workers-0", "j2", ("jobset.x-k8s.io/v1alpha2", "JobSet", "ts", "js1")),
        obj("jobset.x-k8s.io/v1alpha2", "JobSet", "ts", "js1"),
        obj("v1", "Pod", "r-head", "p3", ("ray.io/v1", "RayCluster", "rc", "rc1")),
        obj("ray.io/v1", "RayCluster", "rc", "rc1", ("ray.io/v1", "RayJob", "rj", "rj1")),
        obj("ray.io/v1", "RayJob", "rj", "rj1"),
    )
    jobs = await OwnerWalker(api, KubernetesJobsConfig()).resolve_all(["team-a/w-0", "team-a/t-0", "team-a/r-head"])
    assert {k: j.id for k, j in jobs.items()} == {
        "team-a/w-0": "team-a/CronJob/nightly", "team-a/t-0": "team-a/JobSet/ts", "team-a/r-head": "team-a/RayJob/rj"}


async def test_an_owner_the_api_will_not_give_stops_the_walk_below_it() -> None:
    api = deployment_api(forbidden=("Deployment",))
    job = await OwnerWalker(api, KubernetesJobsConfig()).resolve("team-a", "llm-7d9-abc")
    assert job is not None and job.id == "team-a/ReplicaSet/llm-7d9"
    assert job.stopped_short is not None and "403" in job.stopped_short


async def test_an_owner_replaced_by_a_new_object_of_the_same_name_is_not_the_owner() -> None:
    api = deployment_api()
    api.objects[("Deployment", "team-a", "llm")]["metadata"]["uid"] = "d2"  # deleted and created again
    job = await OwnerWalker(api, KubernetesJobsConfig()).resolve("team-a", "llm-7d9-abc")
    assert job is not None and job.id == "team-a/ReplicaSet/llm-7d9"


async def test_the_core_publishes_one_kubernetes_job_per_owner_and_unused_allocations() -> None:
    api = deployment_api()
    walker = OwnerWalker(api, KubernetesJobsConfig())
    core = NodeCore(node="n1", cluster="c1", thresholds=ThresholdsConfig(), snapshot_interval_s=15)
    u = [f"GPU-{i}" for i in range(3)]
    inputs = NodeInputs(
        kube_pods={"team-a/llm-7d9-abc": PodAllocation("team-a", "llm-7d9-abc", (u[0],)),
                   "team-a/llm-7d9-def": PodAllocation("team-a", "llm-7d9-def", (u[1],)),
                   "kube-system/dns": PodAllocation("kube-system", "dns")},
        kube_jobs=await walker.resolve_all(["team-a/llm-7d9-abc", "team-a/llm-7d9-def"]))
    ident = ProcessIdentity(pid=42, create_time=T0, name="python", user="alice", pod="team-a/llm-7d9-abc")
    reading = NodeReading(gpus=tuple(GpuReading(index=i, uuid=u[i], util_pct=0.0) for i in range(3)),
                          procs=(ProcReading(pid=42, gpu=0, mem_mib=100.0),))
    core.step(T0, reading, {42: ident}, inputs)
    snap = core.snapshot(T0)
    assert [(g.index, g.allocated, g.job) for g in snap.gpus] == [
        (0, True, "team-a/Deployment/llm"), (1, True, "team-a/Deployment/llm"), (2, False, None)]
    (job,) = snap.jobs
    assert job.scheduler == "kubernetes" and job.id == "team-a/Deployment/llm" and job.namespace == "team-a"
    assert job.gpus == [0, 1] and job.pids == [42] and job.pods == ["llm-7d9-abc", "llm-7d9-def"]
    assert job.controller == "Deployment/llm" and job.controller_uid == "d1"
    assert snap.processes[0].job == "team-a/Deployment/llm"
    core.step(T0, reading, {42: ident}, replace(inputs, kube_pods=None))  # the kubelet went away: unknown
    assert [g.allocated for g in core.snapshot(T0).gpus] == [None, None, None]  # not "not allocated"
