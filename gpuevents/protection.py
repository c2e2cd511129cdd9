"""Defence in depth: whether config `protect` forbids a destructive action on this entity."""

from __future__ import annotations

from typing import Any

from gpuevents.config import ProtectConfig
from gpuevents.facts import Facts, ProcessFacts
from gpuevents.records import ActionRequest


def protection_reason(request: ActionRequest, protect: ProtectConfig) -> str | None:
    """Why this destructive action must not touch this entity (`user root (pid 7)`,
    `node label tier=prod`, …), or None.

    Node labels protect everything on the node. Users, process names and namespaces protect
    processes: from `kill`, every process it would signal (all of a GPU's); from other
    destructive actions, the entity itself when it is a process (cordoning a node is not
    refused because a protected user also has a process on it). A `scale` of a workload in a
    protected namespace is refused (scaling it back to `previous` is not).

    Where it cannot tell, it refuses (fails closed): a process whose user the agent could not
    name (a bare uid: the agent could not read the host's user database) when users are
    protected; a process in a container whose pod is unknown when namespaces are protected.
    """
    facts = request.facts
    for key, value in protect.node_labels.items():
        if facts.node.labels.get(key) == value:
            return f"node label {key}={value}"
    procs: list[ProcessFacts] = []
    if request.type == "kill":
        procs.extend(facts.processes)
    if facts.process is not None:
        procs.append(facts.process)
    if request.type == "scale":
        why = _scale_target(request.params, protect)
        if why is not None:
            return why
    if request.type in JOB_ACTIONS and protect.namespaces:
        why = _job_namespace(request, facts, protect)
        if why is not None:
            return why
    users = set(protect.users)
    for p in procs:
        if p.user is not None and p.user in users:
            return f"user {p.user} (pid {p.pid})"
        if users and (p.user is None or p.user.isdigit()):
            who = f"uid {p.uid}" if p.uid is not None else (f"uid {p.user}" if p.user else "no user")
            return f"user of pid {p.pid} unknown ({who}): cannot tell whether it is protected"
        if p.pod and "/" in p.pod and p.pod.split("/", 1)[0] in protect.namespaces:
            return f"namespace {p.pod.split('/', 1)[0]} (pod {p.pod})"
        if protect.namespaces and not p.pod and (p.pod_uid or p.container_id):
            return f"pid {p.pid} runs in a container whose pod is unknown: cannot tell its namespace"
        program = protect.program_reason(p.pid, p.exe, p.user)  # its program, never the name it gives itself
        if program is not None:
            return program
    return None


JOB_ACTIONS = frozenset({"pause", "cancel"})
"""Actions on a Kubernetes job as a whole: refused here, before any limit counts them, when its namespace is
protected (the runner refuses them too; a refusal for protection takes no max_per_hour slot)."""


def _job_namespace(request: ActionRequest, facts: Facts, protect: ProtectConfig) -> str | None:
    job = request.params.get("job") or (facts.job.id if facts.job and facts.job.scheduler in (None, "kubernetes")
                                        else None) or (facts.gpu.job if facts.gpu else None)
    parts = str(job).split("/") if job else []
    ns = parts[0] if len(parts) in (2, 3) and all(parts) else (facts.job.namespace if facts.job else None)
    if ns is not None and ns in protect.namespaces:
        return f"namespace {ns} (job {job})"
    return None


def _scale_target(params: dict[str, Any], protect: ProtectConfig) -> str | None:
    ns = params.get("namespace", "default")
    if params.get("provider", "kubernetes") != "kubernetes" or params.get("replicas") == "previous":
        return None
    if ns in protect.namespaces:
        return f"namespace {ns} (scale target {params.get('kind', 'Deployment')} {params.get('name')})"
    return None
