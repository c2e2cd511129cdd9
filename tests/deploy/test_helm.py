"""The Helm chart deploy/helm/gpuevents: `helm lint`, `helm template` with its defaults and with every option on,
schemas, what the agent mounts, the NetworkPolicy, and deploy/kubernetes rendered from it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.conftest import DEPLOY
from tests.kube_cluster import bin_dir

CHART = DEPLOY / "helm" / "gpuevents"
RENDER = DEPLOY / "helm" / "render_kustomize.py"
NO_SCHEMA = {"ServiceMonitor"}  # a CRD of the Prometheus Operator: kubernetes-validate has no schema for it


@pytest.fixture(scope="module")
def helm() -> str:
    path = bin_dir() / "helm"
    if not os.access(path, os.X_OK):
        pytest.fail(f"no helm at {path}: run scripts/k8s-test-tools.sh (.ci/run does)", pytrace=False)
    return str(path)


def helm_template(helm: str, *sets: str, namespace: str = "gpuevents") -> subprocess.CompletedProcess[str]:
    args = [a for s in sets for a in ("--set", s)]
    return subprocess.run([helm, "template", "gpuevents", str(CHART), "--namespace", namespace, *args],
                          capture_output=True, text=True, timeout=60)


def template(helm: str, *sets: str, namespace: str = "gpuevents") -> list[dict[str, Any]]:
    out = helm_template(helm, *sets, namespace=namespace)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def refused(helm: str, *sets: str, namespace: str = "gpuevents") -> str:
    """The one-line reason `helm template` refuses these values (it renders nothing)."""
    out = helm_template(helm, *sets, namespace=namespace)
    assert out.returncode != 0 and not out.stdout.strip(), out.stdout
    return out.stderr


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def test_helm_lint_passes_strict(helm: str) -> None:
    out = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("sets", [(), ("namespace.create=true", "serviceMonitor.enabled=true",
                                       "runner.rbac.namespaces={ml,research}", "runner.rbac.nodes=true",
                                       "engine.persistence.enabled=true", "slack.enabled=true",
                                       "config.engine.dry_run=false", "image.registry=ghcr.io/acme",
                                       "networkPolicy.dashboardFrom[0].podSelector.matchLabels.app=ingress")],
                         ids=["defaults", "everything-on"])
def test_every_rendered_object_passes_the_kubernetes_schema(helm: str, sets: tuple[str, ...]) -> None:
    docs = template(helm, *sets)
    kinds = {d["kind"] for d in docs}
    assert {"DaemonSet", "Deployment", "ClusterRole", "NetworkPolicy", "ConfigMap"} <= kinds
    for doc in docs:
        if doc["kind"] not in NO_SCHEMA:
            kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    assert ("ServiceMonitor" in kinds) == ("serviceMonitor.enabled=true" in sets)
    assert ("Namespace" in kinds) == ("namespace.create=true" in sets)


def test_agent_mounts_the_pod_resources_socket_and_the_hosts_passwd(helm: str) -> None:
    ds = one(template(helm), "DaemonSet", "gpuevents-agent")
    pod = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert pod["hostPID"] is True
    assert volumes[mounts["/var/lib/kubelet/pod-resources"]["name"]]["hostPath"]["path"] == \
        "/var/lib/kubelet/pod-resources"
    assert volumes[mounts["/host/etc/passwd"]["name"]]["hostPath"] == {"path": "/etc/passwd", "type": "File"}
    assert mounts["/host/etc/passwd"]["readOnly"] is True and mounts["/var/lib/kubelet/pod-resources"]["readOnly"]


def test_the_engine_acts_through_the_runners_and_holds_no_token(helm: str) -> None:
    docs = template(helm)
    config = yaml.safe_load(one(docs, "ConfigMap", "gpuevents-config")["data"]["config.yaml"])
    assert config["engine"]["runners"] == 0 and config["engine"]["dry_run"] is True
    engine = one(docs, "Deployment", "gpuevents-engine")["spec"]["template"]["spec"]
    assert engine["automountServiceAccountToken"] is False
    assert one(docs, "ServiceAccount", "gpuevents-engine")["automountServiceAccountToken"] is False
    assert not [b for b in docs if b["kind"].endswith("Binding")
                and any(s["name"] == "gpuevents-engine" for s in b["subjects"])]
    runner = one(docs, "Deployment", "gpuevents-runner")["spec"]["template"]["spec"]
    assert runner["serviceAccountName"] == "gpuevents-runner"


def test_metrics_are_reachable_from_prometheus_only(helm: str) -> None:
    docs = template(helm)
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                  "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    for name in ("gpuevents-agent", "gpuevents-engine"):
        policy = one(docs, "NetworkPolicy", name)["spec"]
        assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": name}
        assert policy["ingress"] == [{"from": [prometheus], "ports": [{"port": "metrics", "protocol": "TCP"}]}]
    runner = one(docs, "NetworkPolicy", "gpuevents-runner")["spec"]
    assert runner["policyTypes"] == ["Ingress"] and "ingress" not in runner  # nothing may connect
    dashboard = {"podSelector": {"matchLabels": {"app": "ingress"}}}
    opened = one(template(helm, "networkPolicy.dashboardFrom[0].podSelector.matchLabels.app=ingress"),
                 "NetworkPolicy", "gpuevents-engine")["spec"]["ingress"]
    assert opened[1] == {"from": [dashboard], "ports": [{"port": "dashboard", "protocol": "TCP"}]}


def test_values_reach_the_objects(helm: str) -> None:
    docs = template(helm, "image.repository=registry.example/gpuevents", "image.tag=9.9", "runner.replicas=5",
                    "cluster=prod-b", "config.engine.dry_run=false", "slack.enabled=true",
                    "runner.rbac.clusterWide=true", "config.protect.namespaces={kube-system,gpu-ops}",
                    namespace="gpu-ops")
    runner = one(docs, "Deployment", "gpuevents-runner")
    assert runner["metadata"]["namespace"] == "gpu-ops" and runner["spec"]["replicas"] == 5
    assert runner["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/gpuevents:9.9"
    config = one(docs, "ConfigMap", "gpuevents-config")["data"]
    assert config["cluster"] == "prod-b" and yaml.safe_load(config["config.yaml"])["engine"]["dry_run"] is False
    binding = one(docs, "ClusterRoleBinding", "gpuevents-runner")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuevents-runner", "namespace": "gpu-ops"}]


def test_deploy_kubernetes_is_the_chart_rendered(helm: str) -> None:
    out = subprocess.run([sys.executable, str(RENDER), "--check", "--helm", helm], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr


def test_render_check_names_a_file_that_drifted(helm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.deploy.conftest import load_script

    render = load_script(RENDER)
    copy = tmp_path / "kubernetes"
    for p in (DEPLOY / "kubernetes").rglob("*.yaml"):
        (copy / p.relative_to(DEPLOY / "kubernetes")).parent.mkdir(parents=True, exist_ok=True)
        (copy / p.relative_to(DEPLOY / "kubernetes")).write_text(p.read_text())
    (copy / "agent.yaml").write_text((copy / "agent.yaml").read_text().replace("hostPID: true", "hostPID: false"))
    monkeypatch.setattr(render, "OUT", copy)
    assert render.main(["--check", "--helm", helm]) == 1
    assert render.main(["--helm", helm]) == 0
    assert render.main(["--check", "--helm", helm]) == 0
    assert "hostPID: true" in (copy / "agent.yaml").read_text()


# ------------------------------------------------------------------ least rights, placement, channel, storage
def _runner_bindings(docs: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return sorted((d["kind"], d["metadata"].get("namespace", ""), d["roleRef"]["name"]) for d in docs
                  if d["kind"].endswith("Binding") and any(s["name"] == "gpuevents-runner" for s in d["subjects"]))


def test_the_runner_has_rights_only_in_the_namespaces_named(helm: str) -> None:
    assert _runner_bindings(template(helm)) == []  # least rights by default: none
    docs = template(helm, "runner.rbac.namespaces={ml,research}")
    assert _runner_bindings(docs) == [("RoleBinding", "ml", "gpuevents-runner"),
                                      ("RoleBinding", "research", "gpuevents-runner")]
    role = one(docs, "ClusterRole", "gpuevents-runner")  # bound per namespace only
    assert not any("nodes" in r["resources"] for r in role["rules"])
    nodes = template(helm, "runner.rbac.nodes=true")
    assert _runner_bindings(nodes) == [("ClusterRoleBinding", "", "gpuevents-runner-nodes")]
    assert {r for rule in one(nodes, "ClusterRole", "gpuevents-runner-nodes")["rules"]
            for r in rule["resources"]} == {"nodes", "pods"}


@pytest.mark.parametrize("namespace", ["kube-system", "gpuevents"])
def test_the_runner_is_never_given_kube_system_or_its_own_namespace(helm: str, namespace: str) -> None:
    why = refused(helm, f"runner.rbac.namespaces={{ml,{namespace}}}")
    assert f"runner.rbac.namespaces: {namespace} is never the runner's to act in" in why


def test_cluster_wide_rights_need_kube_system_and_the_release_protected(helm: str) -> None:
    why = refused(helm, "runner.rbac.clusterWide=true", "config.protect.namespaces={gpuevents}")
    assert "config.protect.namespaces must list it" in why and "kube-system" in why
    assert _runner_bindings(template(helm, "runner.rbac.clusterWide=true")) == [
        ("ClusterRoleBinding", "", "gpuevents-runner")]


def test_engine_and_runner_stay_off_gpu_nodes_by_default(helm: str) -> None:
    docs = template(helm)
    off = {"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]}
    for name in ("gpuevents-engine", "gpuevents-runner"):
        affinity = one(docs, "Deployment", name)["spec"]["template"]["spec"]["affinity"]
        terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [off]}], name
    engine = one(docs, "Deployment", "gpuevents-engine")["spec"]["template"]["spec"]["affinity"]
    assert "podAntiAffinity" in engine  # the replicas still spread over hosts
    lifted = one(template(helm, "offGpuNodes=null"), "Deployment", "gpuevents-runner")["spec"]["template"]["spec"]
    assert "affinity" not in lifted


def test_enforcing_requires_a_warning_channel(helm: str) -> None:
    why = refused(helm, "config.engine.dry_run=false")
    assert "no warning channel is configured" in why and "slack.enabled=true" in why
    docs = template(helm, "config.engine.dry_run=false", "slack.enabled=true", "slack.secretName=slack-bot")
    env = {e["name"]: e for e in one(docs, "Deployment", "gpuevents-runner")["spec"]["template"]["spec"][
        "containers"][0]["env"]}
    assert env["SLACK_BOT_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "slack-bot", "key": "token",
                                                                   "optional": False}
    assert template(helm, "config.engine.dry_run=false",
                    "config.actions.notify.services.teams.url_env=TEAMS_URL")  # another channel will do
    assert template(helm, "config.engine.dry_run=false", "config.actions.email.host=smtp.example.org")
    assert template(helm)  # a dry run needs none


def test_the_image_may_name_its_registry(helm: str) -> None:
    docs = template(helm, "image.registry=ghcr.io/acme/", "image.tag=1.2")
    for kind, name in (("Deployment", "gpuevents-engine"), ("Deployment", "gpuevents-runner"),
                       ("DaemonSet", "gpuevents-agent")):
        assert one(docs, kind, name)["spec"]["template"]["spec"]["containers"][0]["image"] == \
            "ghcr.io/acme/gpuevents:1.2"
    assert one(template(helm), "DaemonSet", "gpuevents-agent")["spec"]["template"]["spec"]["containers"][0][
        "image"] == "gpuevents:0.1.0"


def test_report_history_may_live_on_a_claim(helm: str) -> None:
    docs = template(helm, "engine.persistence.enabled=true", "engine.persistence.size=20Gi",
                    "engine.persistence.storageClassName=fast")
    claim = one(docs, "PersistentVolumeClaim", "gpuevents-engine-state")
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "storageClassName": "fast",
                             "resources": {"requests": {"storage": "20Gi"}}}
    volumes = {v["name"]: v for v in one(docs, "Deployment", "gpuevents-engine")["spec"]["template"]["spec"][
        "volumes"]}
    assert volumes["state"] == {"name": "state", "persistentVolumeClaim": {"claimName": "gpuevents-engine-state"}}
    assert "emptyDir" in {v["name"]: v for v in one(template(helm), "Deployment", "gpuevents-engine")["spec"][
        "template"]["spec"]["volumes"]}["state"]
    why = refused(helm, "engine.persistence.enabled=true", "engine.persistence.accessModes={ReadWriteOnce}")
    assert "accessModes needs ReadWriteMany (or set engine.replicas=1)" in why
    assert template(helm, "engine.persistence.enabled=true", "engine.persistence.accessModes={ReadWriteOnce}",
                    "engine.replicas=1")


def test_the_namespace_it_creates_carries_the_pod_security_label(helm: str) -> None:
    ns = one(template(helm, "namespace.create=true"), "Namespace", "gpuevents")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_one_kubernetes_version_floor(helm: str) -> None:
    """The chart says 1.33+, and nothing it renders, with any option, is for an older cluster."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.33.0-0"
    values = (CHART / "values.yaml").read_text()
    assert "1.33" not in values and "nodes/proxy" not in values and "Legacy" not in values
    out = subprocess.run([helm, "template", "gpuevents", str(CHART), "--kube-version", "1.32.0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "kubeVersion" in out.stderr
