"""Evidence, not claims (DESIGN §3.4): a node's report is evidence about that node only. Before a remedy on more
than a process of the reporting node, the runner confirms the target at the source of truth and acts on what it
found there, never on what a node said:

- Kubernetes (`pause` of a job, `scale` down of a Deployment or StatefulSet that the facts name as the entity's
  job, `cancel` of a pod): the API server
  shows, on every reporting node, pods bound there that hold GPUs (at least as many as the claim names on that
  node) and whose owner chain reaches the target with the uid decided on; a target decided on without a uid is
  resolved here (the uid and generation of what the pods' chain reaches), never acted on blind. The request goes on
  with the job's facts as the API server gave them: its uid, generation, namespace, annotations and pods.
- Slurm (`cancel`): slurmctld (`squeue`) shows the job running, on every reporting node (`scontrol show hostnames`
  expands its node list). A job that already ended is left to `cancel`, which says so.

A request with no reporting node (a person's `gpuevents pause TARGET`) names its target itself: only the uid is
resolved. A claim the source of truth contradicts is refused, audited and counted per node
(`gpuevents_claims_contradicted_total{node}`), so a node that keeps lying shows. An API server or scheduler that
cannot be asked is a TransientError: the runner tries again (actions/convergence.py).
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from actions.errors import TransientError
from actions.protocol import ActionContext, ActionParams
from gpuevents.records import ActionRequest

log = logging.getLogger(__name__)

MAX_OWNER_DEPTH = 8
_SLURM_JOB = re.compile(r"^\d+(_\d+)?$")


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


@dataclass(frozen=True)
class Contradicted(Exception):
    """The source of truth says otherwise: `detail` for the audit, `nodes` whose claim it contradicts."""

    detail: str
    nodes: tuple[str, ...]

    def __str__(self) -> str:
        return self.detail


def _job_facts(req: ActionRequest) -> dict[str, Any]:
    job = req.facts.get("job")
    return dict(job) if isinstance(job, dict) else {}


def reporting_nodes(req: ActionRequest) -> list[str]:
    """The nodes whose reports the decision rests on: the job's nodes, else the entity's node; none for a
    person's request."""
    nodes = _job_facts(req).get("nodes")
    if isinstance(nodes, list) and nodes:
        return sorted({str(n) for n in nodes})
    return [req.node] if req.node else []


def claimed_gpus(req: ActionRequest, node: str) -> int:
    """How many GPUs the request's facts say the target holds on `node` (at least one)."""
    gpus = req.facts.get("gpus")
    if not isinstance(gpus, list):
        gpu = req.facts.get("gpu")
        gpus = [gpu] if isinstance(gpu, dict) else []
    n = sum(1 for g in gpus if isinstance(g, dict) and g.get("node") in (node, None))
    return max(n, 1)


def with_job(req: ActionRequest, **fields: Any) -> ActionRequest:
    facts = dict(req.facts)
    facts["job"] = {**_job_facts(req), **fields}
    return req.model_copy(update={"facts": facts})


async def confirm(ctx: ActionContext) -> ActionRequest:
    """The request as the source of truth confirms it (its job facts replaced by what was found there), or raise
    Contradicted; other actions pass through unchanged."""
    req, p = ctx.request, ctx.params
    kind = _confirmation(req, p)
    if kind is None:
        return req
    if kind == "slurm":
        return await _confirm_slurm(ctx)
    from actions import evidence_kube

    return await evidence_kube.confirm(ctx, kind)


def _confirmation(req: ActionRequest, p: ActionParams) -> str | None:
    """Which confirmation this request needs: `pause`, `scale`, `pod`, `slurm`, or None."""
    provider = getattr(p, "provider", None)
    if req.type == "pause":
        return "pause"
    if req.type == "scale" and provider == "kubernetes" and getattr(p, "replicas", None) != "previous":
        return "scale"
    if req.type == "cancel":
        return "pod" if provider == "kubernetes" else "slurm"
    return None


def refusal(e: Contradicted, req: ActionRequest) -> str:
    """Count the contradiction against its nodes and say it for the audit."""
    CONTRADICTED.add(e.nodes)
    log.warning("%s on %s refused: the source of truth contradicts node %s: %s", req.type, req.entity_id,
                ", ".join(e.nodes) or "?", e.detail)
    return f"contradicted at the source of truth ({', '.join(e.nodes) or 'no node'}): {e.detail}"


# ---------------------------------------------------------------- Slurm
async def _confirm_slurm(ctx: ActionContext) -> ActionRequest:
    from actions.builtin.cancel import job_of
    from actions.procrun import run_argv
    from actions.specs.cancel import CancelParams

    req = ctx.request
    nodes = reporting_nodes(req)
    assert isinstance(ctx.params, CancelParams)
    job_id, _ = job_of(ctx.params, req.facts)
    if not nodes or job_id is None or not _SLURM_JOB.match(job_id):
        return req  # a person's cancel, or an id cancel refuses itself
    cfg = ctx.config.actions.slurm
    limit = ctx.config.actions.timeout / 4
    out_max = ctx.config.actions.command_output_max
    try:
        shown = await run_argv([str(cfg.squeue), "-h", "--states=all", "-j", job_id, "-o", "%i|%T|%N"],
                               timeout=limit, output_max=out_max)
    except (FileNotFoundError, PermissionError) as e:
        raise TransientError(f"cannot run {cfg.squeue}: {e.strerror or e}") from None
    lines = [line.split("|") for line in shown.output.splitlines() if line.strip()]
    if shown.returncode != 0 or len(lines) != 1 or len(lines[0]) != 3 or lines[0][0].strip() != job_id:
        if "Invalid job id" in shown.output:
            return req  # gone from the queue: cancel says it already ended
        raise TransientError(f"cannot read job {job_id} from slurmctld ({shown.summary()})")
    state, nodelist = lines[0][1].strip(), lines[0][2].strip()
    if state in ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
                 "DEADLINE", "OUT_OF_MEMORY"):
        return req
    if state != "RUNNING":
        raise Contradicted(f"slurmctld shows job {job_id} {state}, not running on {', '.join(nodes)}",
                           tuple(nodes))
    expanded = await run_argv([str(cfg.scontrol), "show", "hostnames", nodelist], timeout=limit,
                              output_max=out_max)
    if expanded.returncode != 0:
        raise TransientError(f"cannot expand the node list {nodelist!r} ({expanded.summary()})")
    held = {line.strip() for line in expanded.output.splitlines() if line.strip()}
    lying = [n for n in nodes if n not in held]
    if lying:
        raise Contradicted(f"slurmctld shows job {job_id} running on {nodelist}, not on {', '.join(lying)}",
                           tuple(lying))
    return with_job(req, nodes=sorted(held))


def gpu_count(pod: Mapping[str, Any]) -> int:
    """GPUs a pod holds by its spec (nvidia.com/gpu or a MIG slice)."""
    from gpuevents.demand import pod_gpus

    return pod_gpus(pod.get("spec") or {})[0]
