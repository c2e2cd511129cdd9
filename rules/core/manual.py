"""A person's remedy or its undo, decided like a rule's action: the entity from the fleet state, protection,
engine.limits, engine.dry_run. An undo (`resume`, `uncordon`) is never limited, and needs no entity the engine
sees: it names its target, and the runner works from what the remedy wrote on the object. Pure: the engine passes
the time and an id, and commits what comes back."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpuevents.config import Config
from gpuevents.facts import Facts, JobFacts, NodeFacts
from gpuevents.protection import protection_reason
from gpuevents.records import ActionRequest
from gpuevents.wire.manual import OPERATOR_RULE, RESTORES, OperatorAction, OperatorActionReply
from rules.core.limits import Limiter
from rules.core.sends import entity_facts
from rules.core.state import Entity, FleetState


def find_target(state: FleetState, req: OperatorAction) -> Entity | None:
    """The process (`node`, `pid`), the node (`node`) or the job (`job`) the request names, as the fleet state
    knows it."""
    if req.type == "kill":
        for e in state.by_kind["process"].values():
            where = e.ctx["entity"]
            if e.view.pid == req.pid and where.node == req.node and where.cluster == req.cluster:
                return e
        return None
    if req.type in ("cordon", "uncordon"):
        for e in state.by_kind["node"].values():
            if e.view.name == req.node and e.ctx["entity"].cluster == req.cluster:
                return e
        return None
    for e in state.by_kind["job"].values():
        if e.view.id == req.job and e.ctx["entity"].cluster == req.cluster:
            return e
    return None


def _params(req: OperatorAction, ent: Entity | None) -> dict[str, Any]:
    reason = req.reason or f"asked by {req.by}"
    if req.type == "kill":
        return {"signal": req.signal, "grace": req.grace, "reason": reason}
    if req.type in ("pause", "resume"):
        return {"job": req.job, **({"reason": reason} if req.type == "pause" else {})}
    if req.type in ("cordon", "uncordon"):
        return {"provider": req.provider, "node": req.node, "reason": reason}
    assert ent is not None
    scheduler = getattr(ent.view, "scheduler", "slurm")
    return {"provider": "kubernetes" if scheduler == "kubernetes" else "slurm", "job": req.job}


def _unseen(req: OperatorAction) -> tuple[str, str, str | None, Facts]:
    """(entity id, kind, node, facts) of an undo's target the engine does not see."""
    if req.type == "resume":
        assert req.job is not None
        return f"job/kubernetes/{req.job}", "job", None, Facts(job=JobFacts(id=req.job, scheduler="kubernetes"))
    assert req.node is not None
    return req.node, "node", req.node, Facts(node=NodeFacts(name=req.node))


def decide(req: OperatorAction, ent: Entity | None, config: Config, limiter: Limiter, now: datetime,
           request_id: str) -> ActionRequest:
    """The action request for `req` on `ent` (None: an undo's target the engine does not see), decided: `refused`
    (protected), `suppressed` (engine.limits), `dry_run` (engine.dry_run), else `run` (counted against the type's
    hourly budget; an undo is never limited)."""
    if ent is not None:
        where = ent.ctx["entity"]
        entity_id, kind, node, facts = ent.id, ent.kind, where.node, entity_facts(ent)
    else:
        entity_id, kind, node, facts = _unseen(req)
    facts = facts.model_copy(update={"requested_by": req.by})
    out = ActionRequest(
        key=f"{OPERATOR_RULE}:{request_id}", type=req.type, params=_params(req, ent), rule=OPERATOR_RULE,
        entity_id=entity_id, entity_kind=kind, cluster=req.cluster, node=node,
        incident_id=f"{OPERATOR_RULE}-{request_id}", destructive=req.type not in RESTORES,
        dry_run=config.engine.dry_run, facts=facts, created_at=now, reason=req.reason or None,
    )
    if req.type in RESTORES:
        if config.engine.dry_run:
            return out.model_copy(update={"decision": "dry_run", "reason": "dry run (engine.dry_run)"})
        return out
    why = protection_reason(out, config.protect)
    if why is not None:
        return out.model_copy(update={"decision": "refused", "reason": f"protected: {why}"})
    decision, why_not = limiter.decide_type(req.type, now.timestamp())
    if decision != "run":
        return out.model_copy(update={"decision": decision, "reason": why_not})
    if config.engine.dry_run:
        return out.model_copy(update={"decision": "dry_run", "reason": "dry run (engine.dry_run)"})
    limiter.record_type(req.type, now.timestamp())
    return out


def reply_for(request: ActionRequest) -> OperatorActionReply:
    return OperatorActionReply(ok=True, decision=request.decision, reason=request.reason, key=request.key,
                               entity_id=request.entity_id)


def unknown_target(req: OperatorAction) -> OperatorActionReply:
    what = f"process {req.pid} on {req.node}" if req.type == "kill" else (
        f"node {req.node}" if req.type in ("cordon", "uncordon") else f"job {req.job}")
    return OperatorActionReply(ok=False, error=f"the engine knows no {what} in cluster {req.cluster} "
                               "(see `gpuevents status`)")
