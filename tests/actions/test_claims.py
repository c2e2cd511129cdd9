"""The parts of a node's claim the runner checks (actions/claims.py), and the per-node count of contradicted
claims on a runner process's own /metrics."""

from __future__ import annotations

from actions.claims import CONTRADICTED, Contradicted, Refused, claimed_gpus, refusal, reporting_nodes
from gpuevents.cli.parts import runner_metrics
from tests.actions.conftest import make_request


def test_the_reporting_nodes_are_the_jobs_else_the_entitys_and_none_for_a_person() -> None:
    job = make_request("pause", node="b", facts={"job": {"nodes": ["c", "a"]}})
    assert reporting_nodes(job) == ["a", "c"]
    assert reporting_nodes(make_request("pause", node="b")) == ["b"]
    assert reporting_nodes(make_request("pause", node=None)) == []


def test_the_gpus_claimed_on_a_node_are_counted_from_the_facts() -> None:
    req = make_request("pause", facts={"gpus": [{"node": "a", "index": 0}, {"node": "a", "index": 1},
                                                {"node": "b", "index": 0}]})
    assert (claimed_gpus(req, "a"), claimed_gpus(req, "b"), claimed_gpus(req, "z")) == (2, 1, 1)


def test_a_contradiction_is_counted_for_its_nodes_on_the_runners_metrics_and_an_exemption_is_not() -> None:
    registry = runner_metrics()
    before = registry.get_sample_value("gpuevents_claims_contradicted_total", {"node": "claims-liar"}) or 0.0
    req = make_request("pause", node="claims-liar")
    said = refusal(Contradicted("no pod of it there", ("claims-liar",)), req)
    assert said == "contradicted at the source of truth (claims-liar): no pod of it there"
    assert refusal(Refused("exempt by its annotation"), req) == "exempt by its annotation"
    assert registry.get_sample_value("gpuevents_claims_contradicted_total", {"node": "claims-liar"}) == before + 1
    assert CONTRADICTED.by_node["claims-liar"] == before + 1
