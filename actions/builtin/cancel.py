"""The `cancel` action's runtime: ends a scheduler job — Slurm `scancel [--signal S] ID` or `scontrol requeue ID`;
Kubernetes: deletes the job's pod.

Before it acts on a Slurm job it reads the job (`squeue -j ID` with the job's name last, one call: the name is
the user's to choose, and in `scontrol show job -o` a name like `x UserId=nobody(65534)` would pass for the job's
own fields) and refuses, as `kill` does
for processes: a job id that is not one job (no hostlist, no option); a job whose user, account, partition or QOS
is protected (config `protect`); a job whose user is not the user the request names (a reused id, or a wrong
attribution); a job whose details cannot be read while something is protected (it cannot tell). A job that has
already left the queue is `ok` ("already ended").
"""

from __future__ import annotations

import re

from lightkube.resources.core_v1 import Pod

from actions.builtin.command import run_command
from actions.kube import kube_errors, post_event
from actions.procrun import run_argv
from actions.protocol import ActionContext, ActionResult
from actions.specs.cancel import CancelParams, CancelSpec
from gpuevents.config import ProtectConfig
from gpuevents.facts import Facts
from gpuevents.kubekinds import split_job_id

_SLURM_JOB = re.compile(r"^\d+(_\d+)?$")
_ENDED = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
          "OUT_OF_MEMORY")


def job_of(params: CancelParams, facts: Facts) -> tuple[str | None, str | None]:
    """(job id, the user the request expects it to belong to) from the parameters and the facts."""
    proc = facts.process
    user = (facts.job.user if facts.job else None) or (proc.user if proc else None)
    if params.job:
        return params.job.strip(), user
    for candidate in (facts.job.id if facts.job else None, proc.job if proc else None,
                      facts.gpu.job if facts.gpu else None):
        if candidate:
            return candidate, user
    return None, user


SQUEUE_FORMAT = "%i|%u|%a|%P|%q|%T|%j"  # the name last: it may hold anything, `|` included


def parse_squeue_job(job_id: str, text: str) -> dict[str, str]:
    """The one line `squeue -h -j ID -o SQUEUE_FORMAT` prints for the job, as `user`, `Account`, `Partition`,
    `QOS`, `JobState` and `JobName`; empty when the output is not exactly that job's line."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        return {}
    fields = lines[0].split("|", 6)
    if len(fields) != 7 or fields[0].strip() != job_id:
        return {}
    _, user, account, partition, qos, state, name = (f.strip() for f in fields)
    return {"user": user, "Account": account, "Partition": partition, "QOS": qos, "JobState": state,
            "JobName": name}


def slurm_refusal(job: dict[str, str], protect: ProtectConfig, expected_user: str | None) -> str | None:
    """Why this Slurm job must not be cancelled, or None."""
    user = job.get("user")
    if user in protect.users:
        return f"user {user} is protected (protect.users)"
    checks = (("Partition", protect.partitions, "partition", "protect.partitions"),
              ("Account", protect.accounts, "account", "protect.accounts"),
              ("QOS", protect.qos, "QOS", "protect.qos"))
    for key, protected, what, where in checks:
        if job.get(key) in protected:
            return f"{what} {job[key]} is protected ({where})"
    if expected_user and user and user != expected_user:
        return f"the job belongs to {user}, not {expected_user}: a reused id or a wrong attribution"
    return None


async def _slurm(ctx: ActionContext, p: CancelParams, job_id: str, expected_user: str | None) -> ActionResult:
    cfg = ctx.config.actions.slurm
    if not _SLURM_JOB.match(job_id):  # digits only: never an option, never a list
        return ActionResult(status="refused", detail=f"{job_id!r} is not one Slurm job id")
    limit = (p.timeout or ctx.config.actions.timeout) * 0.95
    try:
        shown = await run_argv([str(cfg.squeue), "-h", "--states=all", "-j", job_id, "-o", SQUEUE_FORMAT],
                               timeout=limit / 3, output_max=ctx.config.actions.command_output_max)
    except (FileNotFoundError, PermissionError) as e:
        return ActionResult(status="failed", detail=f"cannot run {cfg.squeue}: {e.strerror or e}")
    job = parse_squeue_job(job_id, shown.output) if shown.returncode == 0 else {}
    if shown.returncode != 0 and "Invalid job id" in shown.output:
        return ActionResult(detail=f"job {job_id} already ended (not in the queue)")
    if not job:
        protected = ctx.config.protect
        if protected.users or protected.partitions or protected.accounts or protected.qos:
            return ActionResult(status="refused", detail=f"cannot read job {job_id} ({shown.summary()}): cannot "
                                "tell whether it is protected")
    state = job.get("JobState", "")
    if state in _ENDED:
        return ActionResult(detail=f"job {job_id} already ended ({state})")
    why = slurm_refusal(job, ctx.config.protect, expected_user)
    if why is not None:
        return ActionResult(status="refused", detail=f"job {job_id}: {why}")
    if p.requeue:
        argv = [str(cfg.scontrol), "requeue", job_id]
    else:
        argv = [str(cfg.scancel), *([f"--signal={p.signal}"] if p.signal else []), job_id]
    result = await run_command(argv, ctx, timeout=p.timeout)
    if result.status == "ok":
        what = "requeued" if p.requeue else (f"signalled {p.signal}" if p.signal else "cancelled")
        return result.model_copy(update={"detail": f"job {job_id} of {job.get('user', '?')} "
                                                   f"({job.get('Partition', '?')}) {what}"})
    return result


async def _kubernetes(ctx: ActionContext, job: str) -> ActionResult:
    parts = split_job_id(job)
    if parts is not None:  # a Kubernetes job id, <namespace>/<Kind>/<name>: its pods' top owner
        namespace, kind, top = parts
        if kind != "Pod":
            return ActionResult(status="refused", detail=f"{job} is a {kind}: a deleted pod of it would be "
                                "started again; `pause` stops it (or give `job: <namespace>/<pod>`)")
        job = f"{namespace}/{top}"
    namespace, _, name = job.partition("/")
    if not namespace or not name:
        return ActionResult(status="refused", detail=f"{job!r} is not namespace/pod")
    if namespace in ctx.config.protect.namespaces:
        return ActionResult(status="refused", detail=f"namespace {namespace} is protected (protect.namespaces)")
    client = ctx.services.kube()
    with kube_errors(f"delete pod {job}"):
        await client.delete(Pod, name, namespace=namespace)
    problem = await post_event(client, {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": namespace}}, "GpueventsCancelled", f"deleted by gpuevents rule {ctx.request.rule}",
        warning=True, now=ctx.services.clock.now())
    return ActionResult(detail=f"pod {job} deleted" + (f"; {problem}" if problem else ""))


class CancelAction(CancelSpec):
    async def run(self, params: CancelParams, ctx: ActionContext) -> ActionResult:
        p = params
        job_id, user = job_of(p, ctx.request.facts)
        if job_id is None:
            return ActionResult(status="refused", detail="no job: the entity is not known to run in a scheduler "
                                "job (give `job:`)")
        if p.provider == "kubernetes":
            if not p.job:
                proc = ctx.request.facts.process
                job_id = proc.pod if proc and proc.pod else job_id
            return await _kubernetes(ctx, job_id)
        return await _slurm(ctx, p, job_id, user)
