"""deploy/kubernetes (the chart deploy/helm/gpuevents rendered, tests/deploy/test_helm.py): schemas, least-privilege
RBAC against the actions' needs, and manifests that agree with each other."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import yaml

from actions import registry
from gpuevents.config import load_config
from tests.deploy.conftest import DEPLOY

K8S = DEPLOY / "kubernetes"
NEEDS = DEPLOY / "helm" / "gpuevents" / "rbac-needs.yaml"
# The oldest Kubernetes these manifests target (nodes/pods for the kubelet's /pods), and the newest
# kubernetes-validate ships schemas for.
K8S_VERSIONS = ("1.33", kubernetes_validate.latest_version())
NOT_MANIFESTS = {"kustomization.yaml"}

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name not in NOT_MANIFESTS)


def docs_of(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def all_docs(paths: list[Path] | None = None) -> Iterator[dict[str, Any]]:
    for path in paths or [K8S / r for r in kustomization()["resources"]]:
        yield from docs_of(path)


def load_yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path}: not a mapping"
    return data


def kustomization() -> dict[str, Any]:
    return load_yaml(K8S / "kustomization.yaml")


def find(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in all_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def rbac_needs() -> dict[str, Any]:
    return load_yaml(NEEDS)


def expand(rows: list[dict[str, Any]]) -> set[Grant]:
    return {(r["apiGroup"], r["resource"], v) for r in rows for v in r["verbs"]}


def granted(docs: list[dict[str, Any]], service_account: str) -> set[Grant]:
    """Every (group, resource, verb) the roles bound to `service_account` in `docs` grant."""
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("ClusterRole", "Role")}
    out: set[Grant] = set()
    for b in docs:
        if b["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == service_account
                   for s in b["subjects"]):
            continue
        role = roles[(b["roleRef"]["kind"], b["roleRef"]["name"])]
        for rule in role["rules"]:
            assert "resourceNames" not in rule and "nonResourceURLs" not in rule, rule
            out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


# ------------------------------------------------------------------ schemas
@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_every_manifest_passes_the_kubernetes_schema(path: Path) -> None:
    docs = docs_of(path)
    assert docs, f"{path} holds no resource"
    for doc in docs:
        for version in K8S_VERSIONS:
            # strict: unknown fields (typos) fail too; a kind without a schema raises, not passes
            kubernetes_validate.validate(doc, version, strict=True)


def test_kustomization_applies_every_manifest_but_the_optional_ones() -> None:
    top = {p.name for p in K8S.glob("*.yaml")} - NOT_MANIFESTS
    assert set(kustomization()["resources"]) == top
    assert all(p.parent.name == "optional" for p in manifest_files() if p.parent != K8S)


# ------------------------------------------------------------------ RBAC
def _union(groups: dict[str, list[dict[str, Any]]]) -> set[Grant]:
    return set().union(*(expand(rows) for rows in groups.values()))


def test_rbac_grants_exactly_what_the_needs_table_lists() -> None:
    """The agent gets its rows; the runner nothing until the site names its namespaces (least rights)."""
    docs = list(all_docs())
    table = rbac_needs()["serviceAccounts"]
    agent = set().union(*(_union(group) for group in table["gpuevents-agent"].values()))
    assert granted(docs, "gpuevents-agent") == agent
    assert granted(docs, "gpuevents-runner") == set()
    bound = {s["name"] for d in docs if d["kind"].endswith("Binding") for s in d["subjects"]}
    assert bound == {"gpuevents-agent"}


def test_optional_rbac_files_grant_exactly_what_the_table_lists() -> None:
    """optional/: the runner's workload rights in every namespace (an opt-in), and its node rights (another)."""
    runner = rbac_needs()["serviceAccounts"]["gpuevents-runner"]
    assert granted(docs_of(K8S / "optional" / "runner-cluster-wide-rbac.yaml"), "gpuevents-runner") == _union(
        runner["actions"])
    assert granted(docs_of(K8S / "optional" / "runner-nodes-rbac.yaml"), "gpuevents-runner") == _union(
        runner["nodeActions"])
    assert not any(r == "nodes" for _, r, _ in _union(runner["actions"]))  # nodes only through their opt-in


def test_no_role_uses_wildcards() -> None:
    for d in all_docs(manifest_files()):
        for rule in d.get("rules", []) if d["kind"] in ("ClusterRole", "Role") else []:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], (d["metadata"]["name"], rule)


def test_the_needs_table_covers_the_kubernetes_actions_of_design() -> None:
    runner = rbac_needs()["serviceAccounts"]["gpuevents-runner"]
    assert set(runner["actions"]) | set(runner["nodeActions"]) == {
        "cordon", "uncordon", "scale", "cancel", "pause", "resume", "drain"}


def test_pause_and_resume_may_patch_every_kind_they_know() -> None:
    from gpuevents.kubekinds import KINDS

    for action in ("pause", "resume"):
        table = expand(rbac_needs()["serviceAccounts"]["gpuevents-runner"]["actions"][action])
        for k in KINDS.values():
            if k.pause is not None:
                assert (k.group, k.plural, "patch") in table, (action, k.kind)


# lightkube AsyncClient method -> Kubernetes verb
_VERBS = {"get": "get", "list": "list", "watch": "watch", "patch": "patch", "replace": "update",
          "create": "create", "delete": "delete", "deletecollection": "deletecollection",
          "apply": "patch"}


def _lightkube_grants(module: ModuleType) -> set[Grant]:
    """The (group, resource, verb) that a module's `client.<verb>(Resource...)` calls need.

    Resources are the lightkube resource classes the module imports (and their `.Scale`
    subresource where it uses one); verbs are the client methods it calls. Every resource is
    paired with every verb: coarse, but exact for modules that do one kind of thing.
    """
    tree = ast.parse(inspect.getsource(module))
    classes: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lightkube.resources."):
            imported = __import__(node.module or "", fromlist=["_"])
            for alias in node.names:
                classes[alias.asname or alias.name] = getattr(imported, alias.name)
    resources: set[tuple[str, str]] = set()
    attribute_bases = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        resource: Any = None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in classes and hasattr(getattr(classes[node.value.id], node.attr, None), "_api_info"):
            resource = getattr(classes[node.value.id], node.attr)  # a subresource: Deployment.Scale
        elif isinstance(node, ast.Name) and node.id in classes and id(node) not in attribute_bases:
            resource = classes[node.id]  # passed to a call, or picked first (`res = Deployment if ...`)
        if resource is not None:
            info = resource._api_info
            group = (info.parent or info.resource).group
            resources.add((group, f"{info.plural}/{info.action}" if info.action else info.plural))
    verbs = {_VERBS[node.func.attr] for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and isinstance(node.func.value, ast.Name) and node.func.value.id == "client"
             and node.func.attr in _VERBS}
    events = {("", "events", "create") for node in ast.walk(tree)  # actions.kube.post_event: an Event on it
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "post_event"}
    return {(g, r, v) for g, r in resources for v in verbs} | events


# what actions/evidence_kube.py reads before the action (generic resources, which the AST above cannot see)
EVIDENCE: dict[str, set[Grant]] = {
    "scale": {("", "pods", "list"), ("apps", "deployments", "get"), ("apps", "statefulsets", "get"),
              ("apps", "replicasets", "get")},
    "cancel": {("", "pods", "get")},
}


@pytest.mark.parametrize("action_type", ["cordon", "uncordon", "scale", "cancel"])
def test_the_needs_table_matches_the_kubernetes_calls_of_each_action(action_type: str) -> None:
    cls = registry.runtime(action_type)  # where its Kubernetes calls are
    module = inspect.getmodule(cls)
    assert module is not None
    from_code = _lightkube_grants(module)
    assert from_code, f"no lightkube call found in {module.__name__}"
    from_code |= EVIDENCE.get(action_type, set())
    runner = rbac_needs()["serviceAccounts"]["gpuevents-runner"]
    table = expand(runner["actions"].get(action_type, [])) | expand(runner["nodeActions"].get(action_type, []))
    assert table == from_code, f"{module.__name__} calls need {sorted(from_code)}"


# ------------------------------------------------------------------ agent and engine pods
def _container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def _env(workload: dict[str, Any], field_values: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: refs resolved, `$(VAR)` expanded."""
    config = find("ConfigMap", "gpuevents-config")["data"]
    env: dict[str, str] = {}
    for e in _container(workload)["env"]:
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                    lambda m: env.get(m.group(1), m.group(0)), e["value"])
        elif "fieldRef" in e["valueFrom"]:
            env[e["name"]] = field_values[e["valueFrom"]["fieldRef"]["fieldPath"]]
        elif "configMapKeyRef" in e["valueFrom"]:
            ref = e["valueFrom"]["configMapKeyRef"]
            assert ref["name"] == "gpuevents-config"
            env[e["name"]] = config[ref["key"]]
        else:
            env[e["name"]] = f"<secret {e['valueFrom']['secretKeyRef']['name']}>"
    return env


def _mounts(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    return {m["mountPath"]: volumes[m["name"]] for m in _container(workload)["volumeMounts"]}


def _config_for(workload: dict[str, Any], tmp_path: Path, env: dict[str, str]) -> Any:
    args = _container(workload)["args"]
    config_path = args[args.index("-c") + 1]
    volume = _mounts(workload)[config_path]
    assert volume["configMap"]["name"] == "gpuevents-config"
    file = tmp_path / "config.yaml"
    file.write_text(find("ConfigMap", "gpuevents-config")["data"]["config.yaml"])
    return load_config(file, env={k: v for k, v in env.items() if k.startswith("GPUEVENTS_")})


AGENT_FIELDS = {"spec.nodeName": "gpu-01", "status.hostIP": "10.0.0.7"}


def test_agent_sees_host_processes_with_only_the_capabilities_it_needs() -> None:
    ds = find("DaemonSet", "gpuevents-agent")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod.get("hostNetwork") is not True and pod.get("hostIPC") is not True
    sc = _container(ds)["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["KILL", "SYS_PTRACE"]}
    assert sc.get("privileged") is not True and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True


def test_agent_reads_nvml_without_taking_a_gpu_from_the_scheduler() -> None:
    ds = find("DaemonSet", "gpuevents-agent")
    env = _env(ds, AGENT_FIELDS)
    assert ds["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    resources = _container(ds)["resources"]
    assert not any("gpu" in k for part in resources.values() for k in part)
    assert ds["spec"]["template"]["spec"]["nodeSelector"]


def test_agent_config_and_environment_load_as_the_pod_sees_them(tmp_path: Path, nats_auth: ModuleType) -> None:
    ds = find("DaemonSet", "gpuevents-agent")
    env = _env(ds, AGENT_FIELDS)
    cfg = _config_for(ds, tmp_path, env)
    cluster = find("ConfigMap", "gpuevents-config")["data"]["cluster"]
    assert cfg.cluster == cluster
    assert cfg.agent.node_name == "gpu-01"
    assert cfg.agent.attribution.kubelet.url == "https://10.0.0.7:10250"
    ports = {p["name"]: p["containerPort"] for p in _container(ds)["ports"]}
    assert cfg.agent.metrics_port == ports["metrics"]
    assert cfg.nats.servers and cfg.nats.streams.replicas == 3
    # its NATS login is the user nats_auth.py made for this node, the password from its Secret
    assert env["NATS_USER"] == nats_auth.agent_user(cluster, "gpu-01")
    password_file = Path(env["NATS_PASSWORD_FILE"])
    assert password_file.name == "gpu-01"
    assert _mounts(ds)[str(password_file.parent)]["secret"]["secretName"] == nats_auth.AGENT_SECRET


def test_engine_runs_two_non_root_replicas_without_capabilities() -> None:
    dep = find("Deployment", "gpuevents-engine")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    sc = _container(dep)["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert pod["serviceAccountName"] == "gpuevents-engine" and pod["automountServiceAccountToken"] is False
    assert find("PodDisruptionBudget", "gpuevents-engine")["spec"]["minAvailable"] == 1


def test_engine_config_ports_rules_and_secrets_agree(tmp_path: Path, nats_auth: ModuleType) -> None:
    dep = find("Deployment", "gpuevents-engine")
    env = _env(dep, {})
    cfg = _config_for(dep, tmp_path, env)
    assert cfg.engine.dry_run is True, "a fresh install starts in dry-run"
    assert cfg.engine.runners == 0, "the runner Deployment carries out the actions"
    mounts = _mounts(dep)
    assert [str(p) for p in cfg.engine.rules] == ["/etc/gpuevents/rules"]
    assert mounts["/etc/gpuevents/rules"]["configMap"]["name"] == "gpuevents-rules"
    assert str(cfg.engine.usage_db.parent) in mounts, "usage_db must be on a writable volume"
    ports = {p["name"]: p["containerPort"] for p in _container(dep)["ports"]}
    assert ports == {"metrics": cfg.engine.metrics_port, "dashboard": cfg.engine.dashboard_port}
    service = find("Service", "gpuevents-engine")
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    assert env["NATS_USER"] == nats_auth.ENGINE_USER
    secret_refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in _container(dep)["env"]
                   if "secretKeyRef" in e.get("valueFrom", {})}
    assert secret_refs["NATS_PASSWORD"] == {"name": nats_auth.ENGINE_SECRET, "key": "nats-password"}
    assert secret_refs["SLACK_BOT_TOKEN"]["optional"] is True


def test_services_select_their_pods() -> None:
    for name in ("gpuevents-agent", "gpuevents-engine"):
        service = find("Service", name)
        workload = next(d for d in all_docs() if d["kind"] in ("DaemonSet", "Deployment")
                        and d["metadata"]["name"] == name)
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_example_rules_load(tmp_path: Path) -> None:
    from rules.lang.loader import load_rule_set

    rules = find("ConfigMap", "gpuevents-rules")["data"]
    for name, text in rules.items():
        (tmp_path / name).write_text(text)
    loaded = load_rule_set([tmp_path])
    assert {r.spec.name for r in loaded.rules} == {"idle-gpu-2h", "idle-gpu-8h-stop"}


def test_rules_load_from_a_configmap_volume_layout(tmp_path: Path) -> None:
    """The kubelet mounts a ConfigMap as symlinks into a `..data` directory it swaps on update."""
    from rules.lang.loader import load_rule_set

    rules = find("ConfigMap", "gpuevents-rules")["data"]
    version = tmp_path / "..2026_12_01_00_00_00.000000001"
    version.mkdir()
    for name, text in rules.items():
        (version / name).write_text(text)
        (tmp_path / name).symlink_to(Path("..data") / name)
    (tmp_path / "..data").symlink_to(version.name)
    loaded = load_rule_set([tmp_path])
    assert sorted(r.spec.name for r in loaded.rules) == ["idle-gpu-2h", "idle-gpu-8h-stop"]


def test_runners_act_with_the_engines_nats_user_and_their_own_service_account() -> None:
    runners = find("Deployment", "gpuevents-runner")
    engine = find("Deployment", "gpuevents-engine")
    pod = runners["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpuevents-runner"
    assert _container(runners)["args"] == ["runner", "-c", "/etc/gpuevents/config.yaml"]
    env = {e["name"]: e for e in _container(runners)["env"]}
    engine_env = {e["name"]: e for e in _container(engine)["env"]}
    for name in ("NATS_USER", "NATS_PASSWORD", "SLACK_BOT_TOKEN", "GPUEVENTS_CLUSTER"):
        assert env[name] == engine_env[name], name
    assert _container(runners)["securityContext"] == _container(engine)["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_example_rules_pass_their_rule_tests(tmp_path: Path) -> None:
    from rules.offline.ruletests import run_test_file

    (tmp_path / "rules").mkdir()
    for name, text in find("ConfigMap", "gpuevents-rules")["data"].items():
        (tmp_path / "rules" / name).write_text(text)
    test_file = tmp_path / "example-rules.test.yaml"
    test_file.write_text((Path(__file__).parent / "example-rules.test.yaml").read_text())
    outcome = run_test_file(test_file)
    assert not outcome.problems, outcome.problems
    assert len(outcome.tests) == 4
    failures = {t.name: t.failures for t in outcome.tests if not t.passed}
    assert not failures, failures
