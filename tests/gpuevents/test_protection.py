"""Which destructive actions config `protect` refuses, from the facts in the request."""

from __future__ import annotations

from gpuevents.config import ProtectConfig
from gpuevents.protection import protection_reason
from tests.actions.conftest import make_request, process_facts

PROTECT = ProtectConfig(users=["root"], process_patterns=["nvidia-*"], node_labels={"tier": "prod"},
                        namespaces=["kube-system"])


def test_kill_on_a_gpu_is_refused_when_any_of_its_processes_is_protected() -> None:
    req = make_request("kill", facts=process_facts((10, "alice", "python"), (11, "bob", "nvidia-smi")))
    assert protection_reason(req, PROTECT) == "program /usr/bin/nvidia-smi matches protected pattern 'nvidia-*'"


def test_kill_of_an_ordinary_process_is_allowed() -> None:
    assert protection_reason(make_request("kill", facts=process_facts((10, "alice", "python"))), PROTECT) is None


def test_pods_in_protected_namespaces_are_protected() -> None:
    facts = {"process": {"pid": 3, "user": "alice", "name": "coredns", "pod": "kube-system/coredns-1"}}
    req = make_request("kill", entity_kind="process", entity_id="n1/pid3", facts=facts)
    assert protection_reason(req, PROTECT) == "namespace kube-system (pod kube-system/coredns-1)"


def test_a_protected_node_label_protects_every_destructive_action_on_it() -> None:
    facts = {"node": {"name": "n1", "labels": {"tier": "prod", "zone": "a"}}}
    for type_ in ("kill", "cordon", "scale", "command"):
        assert protection_reason(make_request(type_, facts=facts), PROTECT) == "node label tier=prod"


def test_cordoning_a_node_is_not_refused_for_a_protected_users_process_on_it() -> None:
    facts = process_facts((1, "root", "dcgm"), (10, "alice", "python"))
    assert protection_reason(make_request("cordon", entity_kind="node", entity_id="n1", facts=facts),
                             PROTECT) is None


def test_a_protected_process_entity_is_protected_from_any_destructive_action() -> None:
    facts = {"process": {"pid": 1, "user": "root", "name": "init"}}
    req = make_request("command", entity_kind="process", entity_id="n1/pid1", facts=facts)
    assert protection_reason(req, PROTECT) == "user root (pid 1)"


def test_a_process_whose_user_is_only_a_uid_is_refused_when_users_are_protected() -> None:
    facts = {"process": {"pid": 7, "user": "0", "uid": 0, "name": "python", "exe": "/usr/bin/python3"}}
    req = make_request("kill", entity_kind="process", entity_id="n1/pid7", facts=facts)
    assert protection_reason(req, PROTECT) == "user of pid 7 unknown (uid 0): cannot tell whether it is protected"
    nouser = make_request("kill", entity_kind="process", entity_id="n1/pid7", facts={"process": {"pid": 7}})
    assert "unknown (no user)" in (protection_reason(nouser, PROTECT) or "")
    assert protection_reason(req, PROTECT.model_copy(update={"users": []})) is None


def test_a_container_process_with_no_known_pod_is_refused_when_namespaces_are_protected() -> None:
    facts = {"process": {"pid": 8, "user": "alice", "name": "python", "container_id": "abc123"}}
    req = make_request("kill", entity_kind="process", entity_id="n1/pid8", facts=facts)
    why = protection_reason(req, PROTECT)
    assert why == "pid 8 runs in a container whose pod is unknown: cannot tell its namespace"
    bare = {"process": {"pid": 8, "user": "alice", "name": "python", "exe": "/usr/bin/python3"}}  # no container
    assert protection_reason(make_request("kill", entity_kind="process", entity_id="n1/pid8", facts=bare),
                             PROTECT) is None


def test_scaling_a_workload_in_a_protected_namespace_is_refused_but_restoring_it_is_not() -> None:
    down = make_request("scale", {"namespace": "kube-system", "name": "coredns", "replicas": 0}, facts={})
    assert protection_reason(down, PROTECT) == "namespace kube-system (scale target Deployment coredns)"
    back = make_request("scale", {"namespace": "kube-system", "name": "coredns", "replicas": "previous"}, facts={})
    assert protection_reason(back, PROTECT) is None
    other = make_request("scale", {"namespace": "ml", "name": "nb", "replicas": 0}, facts={})
    assert protection_reason(other, PROTECT) is None


def test_the_name_a_process_gives_itself_protects_nothing_its_program_does() -> None:
    renamed = {"process": {"pid": 9, "user": "alice", "name": "nvidia-smi", "exe": "/usr/bin/python3.12"}}
    req = make_request("kill", entity_kind="process", entity_id="n1/pid9", facts=renamed)
    assert protection_reason(req, PROTECT) is None
    by_path = PROTECT.model_copy(update={"process_patterns": ["/usr/bin/nvidia-*"]})
    real = {"process": {"pid": 9, "user": "alice", "name": "x", "exe": "/usr/bin/nvidia-smi"}}
    assert protection_reason(make_request("kill", entity_kind="process", entity_id="n1/pid9", facts=real),
                             by_path) == "program /usr/bin/nvidia-smi matches protected pattern '/usr/bin/nvidia-*'"


def test_an_unknown_program_is_refused_when_programs_are_protected() -> None:
    unknown = {"process": {"pid": 9, "user": "alice", "name": "nvidia-smi"}}  # an agent that did not say
    req = make_request("kill", entity_kind="process", entity_id="n1/pid9", facts=unknown)
    assert protection_reason(req, PROTECT) == "the program of pid 9 is unknown: cannot tell whether it is protected"
    assert protection_reason(req, PROTECT.model_copy(update={"process_patterns": []})) is None
