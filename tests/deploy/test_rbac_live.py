"""The chart's RBAC applied to a real API server (tests/kube_cluster.py): what each ServiceAccount can and cannot
do, asked of the server (SelfSubjectAccessReview as that account) and tried (the runner's actions, as the runner)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.models.apps_v1 import DeploymentSpec
from lightkube.models.authorization_v1 import ResourceAttributes, SelfSubjectAccessReviewSpec
from lightkube.models.core_v1 import Container, PodSpec, PodTemplateSpec, ResourceRequirements
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview
from lightkube.resources.core_v1 import Node, Pod, Secret

from actions.runner import ActionRunner
from tests.actions.conftest import make_config, make_request
from tests.deploy.test_helm import CHART, helm  # noqa: F401 - the fixture
from tests.kube_cluster import KubeCluster


@dataclass
class Installed:
    namespace: str
    kubeconfigs: dict[str, Path]  # ServiceAccount -> a kubeconfig acting as it
    workloads: str  # the one namespace of runner.rbac.namespaces

    def client(self, account: str) -> Client:
        return Client(config=KubeConfig.from_file(self.kubeconfigs[account]), trust_env=False)


@pytest.fixture(scope="module")
def installed(kube_cluster: KubeCluster, helm: str) -> Iterator[Installed]:  # noqa: F811
    """The chart's ServiceAccounts, roles and bindings, rendered for a fresh namespace and applied as admin: the
    runner may act on workloads in one namespace (runner.rbac.namespaces) and on nodes (runner.rbac.nodes)."""
    ns = kube_cluster.namespace("gpuevents")
    workloads = kube_cluster.namespace("ml")
    out = subprocess.run([helm, "template", "gpuevents", str(CHART), "--namespace", ns, "--show-only",
                          "templates/rbac.yaml", "--set", f"runner.rbac.namespaces={{{workloads}}}",
                          "--set", "runner.rbac.nodes=true"], capture_output=True, text=True, timeout=60, check=True)
    admin = kube_cluster.sync_client()
    objects = codecs.load_all_yaml(out.stdout)
    for obj in objects:
        admin.apply(obj, field_manager="tests", force=True)
    accounts = [d["metadata"]["name"] for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "ServiceAccount"]
    assert sorted(accounts) == ["gpuevents-agent", "gpuevents-engine", "gpuevents-runner"]
    yield Installed(ns, {a: kube_cluster.service_account_kubeconfig(ns, a) for a in accounts}, workloads)


def allowed(client: Client, verb: str, resource: str, group: str = "", namespace: str | None = "ml") -> bool:
    plural, _, sub = resource.partition("/")
    attributes = ResourceAttributes(verb=verb, resource=plural, subresource=sub or None, group=group,
                                    namespace=None if plural in ("nodes", "namespaces") else namespace)
    review = client.create(SelfSubjectAccessReview(spec=SelfSubjectAccessReviewSpec(resourceAttributes=attributes)))
    assert review.status is not None
    return review.status.allowed


def needs() -> dict[str, list[tuple[str, str, str]]]:
    table = yaml.safe_load((CHART / "rbac-needs.yaml").read_text())["serviceAccounts"]
    return {account: [(row["apiGroup"], row["resource"], verb) for group in parts.values()
                      for rows in group.values() for row in rows for verb in row["verbs"]]
            for account, parts in table.items()}


@pytest.mark.parametrize("account", ["gpuevents-agent", "gpuevents-runner"])
def test_every_row_of_the_needs_table_is_allowed(installed: Installed, account: str) -> None:
    client = installed.client(account)
    denied = [row for row in needs()[account] if not allowed(client, row[2], row[1], row[0], installed.workloads)]
    assert not denied, f"{account} is refused what it needs: {denied}"


# (verb, resource, group) that no gpuevents account may do, and a few that one account may but another not
FORBIDDEN_TO_ALL = [("get", "secrets", ""), ("list", "secrets", ""), ("create", "pods", ""),
                    ("create", "pods/exec", ""), ("delete", "nodes", ""), ("update", "deployments", "apps"),
                    ("patch", "deployments", "apps"), ("create", "clusterrolebindings", "rbac.authorization.k8s.io"),
                    ("escalate", "clusterroles", "rbac.authorization.k8s.io"), ("impersonate", "serviceaccounts", "")]
EXPECTED = {
    "gpuevents-agent": {("get", "nodes", ""): True, ("patch", "nodes", ""): False, ("list", "nodes", ""): False,
                        ("get", "nodes/pods", ""): True, ("get", "nodes/proxy", ""): False,
                        ("watch", "pods", ""): True, ("delete", "pods", ""): False,
                        ("get", "replicasets", "apps"): True, ("patch", "deployments/scale", "apps"): False},
    "gpuevents-runner": {("patch", "nodes", ""): True, ("patch", "deployments/scale", "apps"): False,
                         ("patch", "statefulsets", "apps"): True, ("delete", "pods", ""): True,
                         # pause reads a pod to find a kind's nearest owner it can stop, and patches workloads;
                         # drain lists a node's pods and evicts them; both post Events
                         ("get", "pods", ""): True, ("list", "pods", ""): True, ("patch", "deployments", "apps"): True,
                         ("patch", "jobs", "batch"): True, ("patch", "notebooks", "kubeflow.org"): True,
                         ("create", "pods/eviction", ""): True, ("create", "events", ""): True,
                         ("update", "deployments", "apps"): False, ("delete", "deployments", "apps"): False,
                         ("get", "nodes/pods", ""): False},
    "gpuevents-engine": {("get", "nodes", ""): False, ("get", "pods", ""): False,
                         ("patch", "deployments/scale", "apps"): False},
}


@pytest.mark.parametrize("account", sorted(EXPECTED))
def test_what_each_account_can_and_cannot_do(installed: Installed, account: str) -> None:
    client = installed.client(account)
    want = {**{c: False for c in FORBIDDEN_TO_ALL}, **EXPECTED[account]}
    got = {(verb, resource, group): allowed(client, verb, resource, group, installed.workloads)
           for verb, resource, group in want}
    assert got == want


def test_the_runner_acts_and_the_agent_is_refused_by_the_server(installed: Installed,
                                                                kube_cluster: KubeCluster) -> None:
    node = kube_cluster.unique("gpu")
    kube_cluster.add_gpu_node(node)
    agent = installed.client("gpuevents-agent")
    with pytest.raises(ApiError) as refused:
        agent.patch(Node, node, {"spec": {"unschedulable": True}})
    assert refused.value.status.code == 403 and refused.value.status.reason == "Forbidden"
    assert agent.get(Node, node).metadata is not None  # reading its node is allowed
    with pytest.raises(ApiError) as secret:
        installed.client("gpuevents-runner").get(Secret, "anything", namespace=installed.namespace)
    assert secret.value.status.code == 403


async def test_the_runners_actions_work_with_exactly_the_runners_rights(installed: Installed,
                                                                        kube_cluster: KubeCluster) -> None:
    node = kube_cluster.unique("gpu")
    kube_cluster.add_gpu_node(node)
    ns = installed.workloads
    admin = kube_cluster.sync_client()
    template = PodTemplateSpec(metadata=ObjectMeta(labels={"app": "web"}),
                               spec=PodSpec(containers=[Container(name="web", image="web:1")]))
    admin.create(Deployment(metadata=ObjectMeta(name="web", namespace=ns), spec=DeploymentSpec(
        replicas=2, selector=LabelSelector(matchLabels={"app": "web"}), template=template)))
    admin.create(Pod(metadata=ObjectMeta(name="lone", namespace=ns), spec=PodSpec(
        nodeName=node, containers=[Container(name="c", image="c:1", resources=ResourceRequirements(
            limits={"nvidia.com/gpu": "1"}))])))
    runner = await ActionRunner.open(None, make_config(actions={"kubernetes": {
        "kubeconfig": str(installed.kubeconfigs["gpuevents-runner"])}}))
    try:
        cordon = await runner.process(make_request("cordon", {}, entity_kind="node", entity_id=node, node=node))
        scale = await runner.process(make_request("scale", {"kind": "Deployment", "namespace": ns, "name": "web",
                                                            "replicas": 0}, node=None))  # a person's
        cancel = await runner.process(make_request("cancel", {"provider": "kubernetes", "job": f"{ns}/lone"},
                                                   entity_kind="job", entity_id=f"{ns}/lone", node=node))
    finally:
        await runner.close()
    assert [r.outcome for r in (cordon, scale, cancel)] == ["ok", "ok", "ok"], (cordon, scale, cancel)
    got = admin.get(Node, node)
    assert got.spec is not None and got.spec.unschedulable is True
    web = admin.get(Deployment, "web", namespace=ns)
    assert web.spec is not None and web.spec.replicas == 0


async def test_pause_resume_and_drain_work_with_exactly_the_runners_rights(installed: Installed,
                                                                           kube_cluster: KubeCluster) -> None:
    from actions.store import MemoryKv

    node = kube_cluster.unique("gpu")
    kube_cluster.add_gpu_node(node)
    ns = installed.workloads
    admin = kube_cluster.sync_client()
    template = PodTemplateSpec(metadata=ObjectMeta(labels={"app": "train"}), spec=PodSpec(
        nodeName=node, containers=[Container(name="t", image="t:1", resources=ResourceRequirements(
        limits={"nvidia.com/gpu": "1"}))]))
    admin.create(Deployment(metadata=ObjectMeta(name="train", namespace=ns), spec=DeploymentSpec(
        replicas=3, selector=LabelSelector(matchLabels={"app": "train"}), template=template)))
    kube_cluster.wait(lambda: len([p for p in admin.list(Pod, namespace=ns) if p.metadata is not None
                                   and (p.metadata.labels or {}).get("app") == "train"]) == 3, 60, "three pods")
    runner = await ActionRunner.open(None, make_config(actions={"kubernetes": {
        "kubeconfig": str(installed.kubeconfigs["gpuevents-runner"])}}), kv=MemoryKv())
    job = {"job": {"id": f"{ns}/Deployment/train", "scheduler": "kubernetes"}}
    try:
        drain = await runner.process(make_request("drain", {"timeout": "2s"}, entity_kind="node", entity_id=node,
                                                  node=node))
        pause = await runner.process(make_request("pause", {}, entity_kind="job", facts=job, node=None))
        paused = admin.get(Deployment, "train", namespace=ns).spec.replicas
        resume = await runner.process(make_request("resume", {}, entity_kind="job", facts=job))
    finally:
        await runner.close()
    assert [r.outcome for r in (drain, pause, resume)] == ["ok", "ok", "ok"], (drain, pause, resume)
    assert "3 GPU pod(s) evicted" in (drain.detail or "") and "no Event posted" not in (drain.detail or "")
    annotations = (admin.get(Node, node).metadata or ObjectMeta()).annotations or {}
    assert json.loads(annotations["gpuevents.io/cordoned"])["via"] == "drain"  # what it changed, on the node
    assert len(json.loads(annotations["gpuevents.io/drained"])["evicted"]) == 3
    assert paused == 0 and "no Event posted" not in (pause.detail or "")
    assert admin.get(Deployment, "train", namespace=ns).spec.replicas == 3


async def test_the_runners_rights_confirm_a_nodes_claim_at_the_api_server(installed: Installed,
                                                                          kube_cluster: KubeCluster) -> None:
    from actions.store import MemoryKv

    home, liar = kube_cluster.unique("gpu"), kube_cluster.unique("liar")
    kube_cluster.add_gpu_node(home)
    kube_cluster.add_gpu_node(liar)
    ns = installed.workloads
    admin = kube_cluster.sync_client()
    template = PodTemplateSpec(metadata=ObjectMeta(labels={"app": "serve"}), spec=PodSpec(
        nodeName=home, containers=[Container(name="s", image="s:1", resources=ResourceRequirements(
            limits={"nvidia.com/gpu": "1"}))]))
    admin.create(Deployment(metadata=ObjectMeta(name="serve", namespace=ns), spec=DeploymentSpec(
        replicas=2, selector=LabelSelector(matchLabels={"app": "serve"}), template=template)))
    kube_cluster.wait(lambda: len([p for p in admin.list(Pod, namespace=ns) if p.metadata is not None
                                   and (p.metadata.labels or {}).get("app") == "serve"]) == 2, 60, "two pods")
    runner = await ActionRunner.open(None, make_config(actions={"kubernetes": {
        "kubeconfig": str(installed.kubeconfigs["gpuevents-runner"])}}), kv=MemoryKv())

    def claim(node: str) -> dict[str, object]:
        return {"job": {"id": f"{ns}/Deployment/serve", "scheduler": "kubernetes", "nodes": [node]},
                "gpus": [{"node": node, "index": 0, "idle": True}]}

    try:
        lie = await runner.process(make_request("pause", {}, entity_kind="job", node=liar, facts=claim(liar)))
        kept = admin.get(Deployment, "serve", namespace=ns).spec.replicas
        truth = await runner.process(make_request("pause", {}, entity_kind="job", node=home, facts=claim(home)))
    finally:
        await runner.close()
    assert lie.outcome == "refused" and "contradicted at the source of truth" in (lie.error or ""), lie
    assert kept == 2
    assert truth.outcome == "ok", truth
    assert admin.get(Deployment, "serve", namespace=ns).spec.replicas == 0


# ------------------------------------------------------------------ least rights per namespace
@pytest.mark.parametrize("where", ["other", "kube-system", "release"])
def test_the_runner_may_not_touch_workloads_outside_its_namespaces(installed: Installed,
                                                                   kube_cluster: KubeCluster, where: str) -> None:
    ns = {"other": kube_cluster.namespace("other"), "kube-system": "kube-system",
          "release": installed.namespace}[where]
    client = installed.client("gpuevents-runner")
    for verb, resource, group in (("patch", "deployments", "apps"), ("patch", "jobs", "batch"),
                                  ("delete", "pods", ""), ("create", "pods/eviction", "")):
        assert not allowed(client, verb, resource, group, ns), (verb, resource, ns)
        assert allowed(client, verb, resource, group, installed.workloads), (verb, resource)


async def test_a_pause_outside_the_runners_namespaces_is_refused_by_the_server(installed: Installed,
                                                                              kube_cluster: KubeCluster) -> None:
    ns = kube_cluster.namespace("other")
    admin = kube_cluster.sync_client()
    template = PodTemplateSpec(metadata=ObjectMeta(labels={"app": "web"}),
                               spec=PodSpec(containers=[Container(name="web", image="web:1")]))
    admin.create(Deployment(metadata=ObjectMeta(name="web", namespace=ns), spec=DeploymentSpec(
        replicas=2, selector=LabelSelector(matchLabels={"app": "web"}), template=template)))
    runner = await ActionRunner.open(None, make_config(actions={"kubernetes": {
        "kubeconfig": str(installed.kubeconfigs["gpuevents-runner"])}}))
    try:
        record = await runner.process(make_request("pause", {}, entity_kind="job", node=None,  # a person's
                                                   facts={"job": {"id": f"{ns}/Deployment/web"}}))
    finally:
        await runner.close()
    assert record.outcome == "failed" and "HTTP 403" in (record.error or "")
    web = admin.get(Deployment, "web", namespace=ns)
    assert web.spec is not None and web.spec.replicas == 2
