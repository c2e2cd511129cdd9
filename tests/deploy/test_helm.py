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


def template(helm: str, *sets: str, namespace: str = "gpuevents") -> list[dict[str, Any]]:
    args = [a for s in sets for a in ("--set", s)]
    out = subprocess.run([helm, "template", "gpuevents", str(CHART), "--namespace", namespace, *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def test_helm_lint_passes_strict(helm: str) -> None:
    out = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("sets", [(), ("namespace.create=true", "serviceMonitor.enabled=true",
                                       "agent.kubeletLegacyRBAC=true", "networkPolicy.dashboardFrom[0]"
                                       ".podSelector.matchLabels.app=ingress")],
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
                    "cluster=prod-b", "config.engine.dry_run=false", namespace="gpu-ops")
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
