"""cordon, uncordon and scale through real lightkube against a local Kubernetes API."""

from __future__ import annotations

from pathlib import Path

from actions.builtin.cordon import ANNOTATION
from actions.runner import ActionRunner
from tests.actions.conftest import make_config, make_request
from tests.actions.fakes import FakeKubernetes, Injected


def runner_for(kubeconfig: Path) -> ActionRunner:
    return ActionRunner(None, make_config(actions={"kubernetes": {"kubeconfig": str(kubeconfig)}}))


async def test_cordon_sets_unschedulable_and_the_annotation(kube: FakeKubernetes, kubeconfig: Path) -> None:
    kube.add_node("n1")
    runner = runner_for(kubeconfig)
    try:
        record = await runner.process(make_request("cordon", {}, entity_kind="node", entity_id="n1"))
    finally:
        await runner.close()
    assert record.outcome == "ok", record
    node = kube.nodes["n1"]
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["annotations"][ANNOTATION].startswith("idle-gpu-2h 20")
    assert kube.patches[0][1] == "application/merge-patch+json"


async def test_gpu_rule_cordons_the_gpus_node_and_uncordon_undoes_it(kube: FakeKubernetes,
                                                                     kubeconfig: Path) -> None:
    kube.add_node("n1")
    runner = runner_for(kubeconfig)
    try:
        await runner.process(make_request("cordon", {}, entity_id="n1/gpu3", node=None))
        assert kube.nodes["n1"]["spec"]["unschedulable"] is True
        record = await runner.process(make_request("uncordon", {}, entity_id="n1/gpu3"))
    finally:
        await runner.close()
    assert record.outcome == "ok" and record.detail == "node n1 uncordoned"
    assert "unschedulable" not in kube.nodes["n1"]["spec"]
    assert ANNOTATION not in kube.nodes["n1"]["metadata"]["annotations"]


async def test_uncordon_leaves_a_node_a_person_cordoned(kube: FakeKubernetes, kubeconfig: Path) -> None:
    kube.add_node("n1", unschedulable=True)
    runner = runner_for(kubeconfig)
    try:
        record = await runner.process(make_request("uncordon", {}, entity_kind="node", entity_id="n1"))
    finally:
        await runner.close()
    assert record.outcome == "ok" and "not cordoned by gpuevents" in (record.detail or "")
    assert kube.nodes["n1"]["spec"]["unschedulable"] is True and kube.patches == []


async def test_unknown_node_fails_without_retrying(kube: FakeKubernetes, kubeconfig: Path) -> None:
    runner = runner_for(kubeconfig)
    try:
        record = await runner.process(make_request("cordon", {}, entity_kind="node", entity_id="ghost",
                                                          node="ghost"))
    finally:
        await runner.close()
    assert record.outcome == "failed" and record.attempt == 1
    assert record.error is not None and "ghost" in record.error and "404" in record.error


async def test_api_5xx_is_retried(kube: FakeKubernetes, kubeconfig: Path) -> None:
    kube.add_node("n1")
    kube.inject.append(Injected(503))
    runner = runner_for(kubeconfig)
    try:
        record = await runner.process(make_request("cordon", {}, entity_kind="node", entity_id="n1"))
    finally:
        await runner.close()
    assert record.outcome == "ok" and record.attempt == 2
    assert kube.nodes["n1"]["spec"]["unschedulable"] is True


async def test_scale_to_zero_then_previous_restores_three(kube: FakeKubernetes, kubeconfig: Path) -> None:
    kube.replicas[("deployments", "ml", "notebook")] = 3
    runner = runner_for(kubeconfig)
    target = {"kind": "Deployment", "namespace": "ml", "name": "notebook"}
    try:
        down = await runner.process(make_request("scale", {**target, "replicas": 0}, entity_kind="node",
                                                 entity_id="n1", rule="weekend-down"))
        assert kube.replicas[("deployments", "ml", "notebook")] == 0
        up = await runner.process(make_request("scale", {**target, "replicas": "previous"},
                                               entity_kind="node", entity_id="n1", rule="weekend-down"))
    finally:
        await runner.close()
    assert (down.outcome, up.outcome) == ("ok", "ok")
    assert down.detail == "Deployment ml/notebook scaled from 3 to 0"
    assert kube.replicas[("deployments", "ml", "notebook")] == 3


async def test_previous_without_an_earlier_scale_fails(kube: FakeKubernetes, kubeconfig: Path) -> None:
    kube.replicas[("statefulsets", "ml", "db")] = 2
    runner = runner_for(kubeconfig)
    try:
        record = await runner.process(make_request("scale", {"kind": "StatefulSet", "namespace": "ml",
                                                             "name": "db", "replicas": "previous"}))
    finally:
        await runner.close()
    assert record.outcome == "failed" and "has not scaled StatefulSet ml/db before" in (record.error or "")
    assert kube.replicas[("statefulsets", "ml", "db")] == 2


async def test_statefulset_scales_through_its_own_subresource(kube: FakeKubernetes, kubeconfig: Path) -> None:
    kube.replicas[("statefulsets", "ml", "db")] = 2
    runner = runner_for(kubeconfig)
    try:
        record = await runner.process(make_request("scale", {"kind": "StatefulSet", "namespace": "ml",
                                                             "name": "db", "replicas": 5}))
    finally:
        await runner.close()
    assert record.outcome == "ok"
    assert kube.patches[-1][0] == "/apis/apps/v1/namespaces/ml/statefulsets/db/scale"
    assert kube.replicas[("statefulsets", "ml", "db")] == 5
