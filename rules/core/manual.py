"""A person's kill or cancel, decided like a rule's action: the entity from the fleet state, protection,
engine.limits, engine.dry_run. Pure: the engine passes the time and an id, and commits what comes back."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpuevents.config import Config
from gpuevents.protection import protection_reason
from gpuevents.records import ActionRequest
from gpuevents.wire.manual import OPERATOR_RULE, OperatorAction, OperatorActionReply
from rules.core.limits import Limiter
from rules.core.sends import entity_facts
from rules.core.state import Entity, FleetState


def find_target(state: FleetState, req: OperatorAction) -> Entity | None:
    """The process (`node`, `pid`) or the job (`job`) the request names, as the fleet state knows it."""
    if req.type == "kill":
        for e in state.by_kind["process"].values():
            where = e.ctx["entity"]
            if e.view.pid == req.pid and where.node == req.node and where.cluster == req.cluster:
                return e
        return None
    for e in state.by_kind["job"].values():
        if e.view.id == req.job and e.ctx["entity"].cluster == req.cluster:
            return e
    return None


def _params(req: OperatorAction, ent: Entity) -> dict[str, Any]:
    if req.type == "kill":
        return {"signal": req.signal, "grace": req.grace, "reason": req.reason or f"asked by {req.by}"}
    scheduler = getattr(ent.view, "scheduler", "slurm")
    return {"provider": "kubernetes" if scheduler == "kubernetes" else "slurm", "job": req.job}


def decide(req: OperatorAction, ent: Entity, config: Config, limiter: Limiter, now: datetime,
           request_id: str) -> ActionRequest:
    """The action request for `req` on `ent`, decided: `refused` (protected), `suppressed` (engine.limits),
    `dry_run` (engine.dry_run), else `run` (counted against the type's hourly budget)."""
    facts = entity_facts(ent, requested_by=req.by)
    where = ent.ctx["entity"]
    out = ActionRequest(
        key=f"{OPERATOR_RULE}:{request_id}", type=req.type, params=_params(req, ent), rule=OPERATOR_RULE,
        entity_id=ent.id, entity_kind=ent.kind, cluster=where.cluster, node=where.node,
        incident_id=f"{OPERATOR_RULE}-{request_id}", destructive=True, dry_run=config.engine.dry_run,
        facts=facts, created_at=now, reason=req.reason or None,
    )
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
    what = f"process {req.pid} on {req.node}" if req.type == "kill" else f"job {req.job}"
    return OperatorActionReply(ok=False, error=f"the engine knows no {what} in cluster {req.cluster} "
                               "(see `gpuevents status`)")
