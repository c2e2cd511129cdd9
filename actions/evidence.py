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

import re

from actions.claims import CONTRADICTED as CONTRADICTED
from actions.claims import Contradicted, reporting_nodes, with_job
from actions.claims import ContradictedClaims as ContradictedClaims
from actions.claims import Refused as Refused
from actions.claims import refusal as refusal
from actions.errors import TransientError
from actions.protocol import ActionContext, ActionParams
from gpuevents.records import ActionRequest

_SLURM_JOB = re.compile(r"^\d+(_\d+)?$")


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
