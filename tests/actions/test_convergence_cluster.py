"""Enforcement converges (actions/convergence.py) on a real control plane: a pause refused by a 403 is tried again
with backoff while its incident stays open, each try audited, and runs once the rights are granted; when the
incident closes, the runner stops trying."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client, codecs
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Pod

from actions.ledger import Claim
from actions.runner import ActionRunner
from actions.store import MemoryKv
from gpuevents.records import ActionRequest, AuditRecord
from gpuevents.subjects import incident_kv_key
from tests.actions.conftest import make_config, make_request
from tests.actions.test_evidence_cluster import claim, deployment, running_pods
from tests.kube_cluster import KubeCluster
from tests.waiting import wait_for

RIGHTS: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
    {"apiGroups": ["apps"], "resources": ["replicasets", "deployments"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


@pytest.fixture
def api(kube_cluster: KubeCluster) -> Iterator[Client]:
    with contextlib.closing(kube_cluster.sync_client()) as c:
        yield c


class AuditingRunner(ActionRunner):
    """A runner that keeps what it audits (no bus here)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.audited: list[AuditRecord] = []

    async def _audit(self, record: AuditRecord, claim: Claim | None, *, one_try: bool = False) -> None:
        self.audited.append(record)
        await super()._audit(record, claim, one_try=one_try)


def grant(api: Client, ns: str, account: str) -> None:
    api.create(codecs.from_dict({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                                 "metadata": {"name": "pauser", "namespace": ns}, "rules": RIGHTS}))
    api.create(codecs.from_dict({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                                 "metadata": {"name": "pauser", "namespace": ns},
                                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pauser"},
                                 "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}]}))


async def setup(cluster: KubeCluster, api: Client, app: str) -> tuple[str, ActionRequest, AuditingRunner, MemoryKv]:
    home = cluster.unique("gpu")
    cluster.add_gpu_node(home)
    ns = cluster.namespace("ml-dev")
    api.create(codecs.from_dict(deployment(ns, app, 2, home)))
    cluster.wait(lambda: running_pods(api, ns, 2), 60, "two pods running")
    job = f"{ns}/Deployment/{app}"
    req = make_request("pause", {}, entity_kind="job", entity_id=f"job/kubernetes/{job}", node=home, rule="pruner",
                       facts=claim(job, home), destructive=True)
    kv = MemoryKv()
    # the engine keeps the incident open in KV
    await kv.put(incident_kv_key("pruner", req.entity_id), json.dumps({"id": req.incident_id}).encode())
    kubeconfig = cluster.service_account_kubeconfig(ns, "runner")  # no rights yet
    runner = await AuditingRunner.open(None, make_config(actions={"kubernetes": {"kubeconfig": str(kubeconfig)}}),
                                       kv=kv)
    return ns, req, runner, kv


async def test_a_pause_refused_by_a_403_converges_once_the_rights_are_granted(
        kube_cluster: KubeCluster, api: Client) -> None:
    ns, req, runner, _ = await setup(kube_cluster, api, "idle")
    started = time.monotonic()
    task = asyncio.create_task(runner.process(req))
    try:
        # past max_attempts (3), still trying: the incident is open
        await wait_for(lambda: len(runner.audited) >= 5, timeout=60, what="five failed tries audited")
        grant(api, ns, "runner")
        final = await asyncio.wait_for(task, 60)
    finally:
        task.cancel()
        await runner.close()
    tries = runner.audited[:-1]
    print(f"\nconverged after {len(tries)} failed tries in {time.monotonic() - started:.1f}s: "
          + ", ".join(f"#{r.attempt} {r.outcome}" for r in runner.audited))
    assert final.outcome == "ok" and final.attempt == len(tries) + 1, final
    assert [r.attempt for r in tries] == list(range(1, len(tries) + 1))
    assert all(r.outcome == "failed" and "HTTP 403" in (r.error or "") and "trying again in" in (r.detail or "")
               for r in tries)
    assert api.get(Deployment, "idle", namespace=ns).spec.replicas == 0


async def test_the_runner_stops_trying_when_the_incident_closes(kube_cluster: KubeCluster, api: Client) -> None:
    ns, req, runner, kv = await setup(kube_cluster, api, "web")
    task = asyncio.create_task(runner.process(req))
    try:
        await wait_for(lambda: len(runner.audited) >= 4, timeout=60, what="four failed tries audited")
        await kv.delete(incident_kv_key("pruner", req.entity_id))  # resolved: the engine drops its record
        final = await asyncio.wait_for(task, 60)
    finally:
        task.cancel()
        await runner.close()
    assert final.outcome == "failed" and "gave up after" in (final.error or "") and "HTTP 403" in (final.error or "")
    assert api.get(Deployment, "web", namespace=ns).spec.replicas == 2
    assert len([p for p in api.list(Pod, namespace=ns)]) == 2
