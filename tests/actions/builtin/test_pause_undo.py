"""Undo from the cluster alone, and all or nothing, on a real control plane (tests/kube_cluster.py): what pause
changed is written on the workload (`gpuevents.io/paused`), so resume works with an empty engine store; a resume
that changes a CronJob and its running Job and is refused part way (a 403) sets the first back."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client, codecs
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import CronJob, Job

from actions.builtin.pause import PAUSED, PAUSED_BY
from actions.runner import ActionRunner
from actions.store import MemoryKv
from gpuevents.records import AuditRecord
from tests.actions.builtin.test_pause import POD_SPEC, deployment
from tests.actions.conftest import make_config, make_request
from tests.kube_cluster import KubeCluster


@pytest.fixture
def api(kube_cluster: KubeCluster) -> Iterator[Client]:
    with contextlib.closing(kube_cluster.sync_client()) as c:
        yield c


async def act(kubeconfig: Any, type_: str, job: str, kv: MemoryKv) -> AuditRecord:
    runner = await ActionRunner.open(None, make_config(actions={"kubernetes": {"kubeconfig": str(kubeconfig)}}), kv=kv)
    try:
        return await runner.process(make_request(type_, {}, entity_kind="job", entity_id=f"job/kubernetes/{job}",
                                                 node=None, facts={"job": {"id": job, "scheduler": "kubernetes"}}))
    finally:
        await runner.close()


async def test_resume_works_from_the_annotation_with_an_empty_store(kube_cluster: KubeCluster,
                                                                   api: Client) -> None:
    ns = kube_cluster.namespace("undo")
    api.create(codecs.from_dict(deployment(ns, "d", 3)))
    job = f"{ns}/Deployment/d"
    assert (await act(kube_cluster.kubeconfig, "pause", job, MemoryKv())).outcome == "ok"
    paused = api.get(Deployment, "d", namespace=ns)
    assert paused.spec is not None and paused.spec.replicas == 0
    annotations = (paused.metadata.annotations if paused.metadata else None) or {}
    written = json.loads(annotations[PAUSED])
    assert written["rule"] == "idle-gpu-2h" and written["at"] and annotations[PAUSED_BY].startswith("idle-gpu-2h ")
    [obj] = written["objects"]
    assert {"path": ["spec", "replicas"], "before": 3, "after": 0} in obj["changes"]

    record = await act(kube_cluster.kubeconfig, "resume", job, MemoryKv())  # the engine's store is gone
    assert record.outcome == "ok", record
    assert "annotation" in (record.detail or "")
    resumed = api.get(Deployment, "d", namespace=ns)
    assert resumed.spec is not None and resumed.spec.replicas == 3
    left = (resumed.metadata.annotations if resumed.metadata else None) or {}
    assert PAUSED not in left and PAUSED_BY not in left


def _cronjob_with_a_running_job(api: Client, ns: str) -> None:
    template = {"spec": {"template": {"spec": {**POD_SPEC, "restartPolicy": "Never"}}}}
    batch = {"apiVersion": "batch/v1"}
    api.create(codecs.from_dict({**batch, "kind": "CronJob", "metadata": {"name": "c", "namespace": ns},
                                 "spec": {"schedule": "0 3 * * *", "jobTemplate": template}}))
    api.create(codecs.from_dict({**batch, "kind": "Job", "metadata": {"name": "c-1", "namespace": ns},
                                 "spec": {"suspend": False, **template["spec"]}}))
    api.patch(CronJob.Status, "c", {"status": {"active": [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "c-1", "namespace": ns}]}}, namespace=ns)


def _may(api: Client, ns: str, account: str, rules: list[dict[str, Any]]) -> None:
    api.create(codecs.from_dict({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                                 "metadata": {"name": account, "namespace": ns}, "rules": rules}))
    api.create(codecs.from_dict({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                                 "metadata": {"name": account, "namespace": ns},
                                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
                                 "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}]}))


def _suspended(api: Client, ns: str) -> tuple[bool | None, bool | None]:
    cron, job = api.get(CronJob, "c", namespace=ns), api.get(Job, "c-1", namespace=ns)
    return (cron.spec.suspend if cron.spec else None), (job.spec.suspend if job.spec else None)


async def test_a_cronjob_resume_refused_part_way_is_set_back_whole(kube_cluster: KubeCluster,
                                                                  api: Client) -> None:
    ns = kube_cluster.namespace("undo")
    _cronjob_with_a_running_job(api, ns)
    kv = MemoryKv()
    assert (await act(kube_cluster.kubeconfig, "pause", f"{ns}/CronJob/c", kv)).outcome == "ok"
    assert _suspended(api, ns) == (True, True)

    # may resume the CronJob, not its Job: the second patch is a 403
    kubeconfig = kube_cluster.service_account_kubeconfig(ns, "half")
    _may(api, ns, "half", [{"apiGroups": ["batch"], "resources": ["cronjobs"], "verbs": ["get", "patch"]},
                           {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]},
                           {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}])
    record = await act(kubeconfig, "resume", f"{ns}/CronJob/c", kv)
    assert record.outcome == "failed" and "HTTP 403" in (record.error or "")
    assert "rolled back: CronJob c set back" in (record.error or "")
    assert _suspended(api, ns) == (True, True)  # never the CronJob running and its Job still stopped

    record = await act(kube_cluster.kubeconfig, "resume", f"{ns}/CronJob/c", kv)  # the rights fixed: converges
    assert record.outcome == "ok", record
    assert _suspended(api, ns) == (False, False)
