"""Which pods drain evicts: GPU pods only; DaemonSet, static and finished pods, protected namespaces and
workload labels are left, with the reason."""

from __future__ import annotations

from typing import Any

from actions.builtin.drain import why_left
from actions.protocol import ActionContext
from tests.actions.conftest import make_config, make_request

RES = ["nvidia.com/gpu", "nvidia.com/mig-"]


def pod(ns: str = "team-a", resources: dict[str, Any] | None = None, **md: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": ns, **md}, "status": {"phase": "Running"},
            "spec": {"containers": [{"name": "c", "resources": resources or {"limits": {"nvidia.com/gpu": "1"}}}]}}


def ctx(**protect: Any) -> ActionContext:
    req = make_request("drain", {})
    cfg = make_config(protect=protect) if protect else make_config()
    return ActionContext(request=req, params=None, config=cfg)  # type: ignore[arg-type]  # these helpers read no params


def test_gpu_pods_are_evicted_and_the_others_left_with_a_reason() -> None:
    c = ctx(namespaces=["kube-system"], workload_labels={"tier": "prod"})
    assert why_left(pod(), c, RES) is None
    assert why_left(pod(resources={"requests": {"nvidia.com/mig-1g.10gb": "1"}}), c, RES) is None
    assert why_left(pod(resources={"limits": {"cpu": "2"}}), c, RES) == "holds no GPU"
    assert why_left(pod(ownerReferences=[{"kind": "DaemonSet", "name": "dcgm"}]), c, RES) == "a DaemonSet's pod"
    assert why_left(pod(annotations={"kubernetes.io/config.mirror": "x"}), c, RES) == "a static pod"
    assert why_left({**pod(), "status": {"phase": "Succeeded"}}, c, RES) == "finished"
    assert why_left(pod(ns="kube-system"), c, RES) == "namespace kube-system is protected"
    assert why_left(pod(labels={"tier": "prod"}), c, RES) == "label tier=prod is protected"
