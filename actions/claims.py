"""What the runner holds against a node's claim (actions/evidence.py): the refusals, the per-node count of
contradicted claims (gpuevents_claims_contradicted_total), and the claim's parts read from a request's facts."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from gpuevents.facts import JobFacts
from gpuevents.records import ActionRequest

log = logging.getLogger(__name__)

MAX_OWNER_DEPTH = 8


class ClaimCounts:
    """Claims contradicted at the source of truth, by node (module-wide: every runner of the process adds here)."""

    def __init__(self) -> None:
        self.by_node: Counter[str] = Counter()

    def add(self, nodes: Sequence[str]) -> None:
        for n in nodes:
            self.by_node[n] += 1


CONTRADICTED = ClaimCounts()


class ContradictedClaims(Collector):
    """gpuevents_claims_contradicted_total{node}: remedies refused because the API server or the scheduler
    contradicted what that node reported."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("gpuevents_claims_contradicted", "Remedies refused because the source of "
                                     "truth contradicted what the node reported, by node", labels=["node"])
        for node, n in sorted(CONTRADICTED.by_node.items()):
            family.add_metric([node], n)
        yield family


class Refused(Exception):
    """The source of truth forbids it (an exemption annotation on the object itself): refused, no node blamed."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class Contradicted(Refused):
    """The source of truth says otherwise: `detail` for the audit, `nodes` whose claim it contradicts."""

    def __init__(self, detail: str, nodes: tuple[str, ...]) -> None:
        super().__init__(detail)
        self.nodes = nodes


def reporting_nodes(req: ActionRequest) -> list[str]:
    """The nodes whose reports the decision rests on: the job's nodes, else the entity's node; none for a
    person's request."""
    job = req.facts.job
    if job is not None and job.nodes:
        return sorted(set(job.nodes))
    return [req.node] if req.node else []


def claimed_gpus(req: ActionRequest, node: str) -> int:
    """How many GPUs the request's facts say the target holds on `node` (at least one)."""
    facts = req.facts
    gpus = facts.gpus if "gpus" in facts.model_fields_set else ([facts.gpu] if facts.gpu is not None else [])
    return max(sum(1 for g in gpus if g.node in (node, None)), 1)


def with_job(req: ActionRequest, **fields: Any) -> ActionRequest:
    """`req` with these fields set on its facts' job (as the source of truth says them)."""
    job = req.facts.job
    known = job.model_dump() if job is not None else {}
    facts = req.facts.model_copy(update={"job": JobFacts.model_validate({**known, **fields})})
    return req.model_copy(update={"facts": facts})


def refusal(e: Refused, req: ActionRequest) -> str:
    """Count a contradiction against its nodes, and say the refusal for the audit."""
    if not isinstance(e, Contradicted):
        return e.detail
    CONTRADICTED.add(e.nodes)
    log.warning("%s on %s refused: the source of truth contradicts node %s: %s", req.type, req.entity_id,
                ", ".join(e.nodes) or "?", e.detail)
    return f"contradicted at the source of truth ({', '.join(e.nodes) or 'no node'}): {e.detail}"


def gpu_count(pod: Mapping[str, Any]) -> int:
    """GPUs a pod holds by its spec (nvidia.com/gpu or a MIG slice)."""
    from gpuevents.demand import pod_gpus

    return pod_gpus(pod.get("spec") or {})[0]
