"""An owner's keep longer than the rule's `snooze_max`: which channel approves the rest (the `approve:` of the
rule's actions), and the request that asks it (a `keep` action, run by the runners once approved)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpuevents.durations import format_duration
from gpuevents.records import ActionRequest, EntityKind
from gpuevents.wire import KeepRequest
from rules.core.state import Entity
from rules.lang.model import Rule

KEEP_ACTION = "keep"


def approving_channel(rule: Rule) -> tuple[str, float] | None:
    """The channel that approves what this rule does (its first action with `approve:`) and how long it has to
    answer; None when the rule names none."""
    for a in (*rule.actions, *rule.on_resolve):
        if a.approve:
            return a.approve, a.approve_within_s
    return None


def keep_approval(rule: Rule, req: KeepRequest, channel: str, within_s: float, entity_kind: EntityKind,
                  cluster: str, node: str | None, now: datetime, request_id: str,
                  over_budget: str | None = None) -> ActionRequest:
    """The `keep` request the approving channel is asked about: approved, the runner asks the engine to keep
    `req.entity_id` until `req.until` (as asked); denied or unanswered, the keep stays at `snooze_max` (past the
    keep budget, `over_budget` says why: it is not kept at all meanwhile)."""
    asked = format_duration((req.until - now).total_seconds())
    why = (f"past the keep budget: {over_budget}" if over_budget else
           f"the rule allows {format_duration(rule.snooze_max_s)}")
    question = f"{req.by} asks to keep it until {req.until:%Y-%m-%d %H:%M} UTC ({asked}; {why}): {req.reason}"
    return ActionRequest(
        key=f"{KEEP_ACTION}:{request_id}", type=KEEP_ACTION, rule=rule.name, entity_id=req.entity_id,
        entity_kind=entity_kind, cluster=cluster, node=node, incident_id=f"{KEEP_ACTION}-{request_id}",
        params={"type": KEEP_ACTION, "until": req.until.isoformat(), "by": req.by, "asked_reason": req.reason,
                "reason": question},
        created_at=now, approve=channel, approve_within=within_s, reason=req.reason,
    )


def entity_team(ent: Entity, team_label: str) -> str:
    """The team of a kept entity: a process's team label on it, else its node's ("" when neither says)."""
    ctx: dict[str, Any] = ent.ctx
    gpus = [ctx["gpu"]] if ent.kind == "gpu" else ctx.get("gpus") or []
    for g in gpus:
        for p in g.processes:
            if p.labels.get(team_label):
                return str(p.labels[team_label])
    node = ctx.get("node")
    return str(node.labels.get(team_label, "")) if node is not None else ""


def entity_gpus(ent: Entity) -> list[tuple[str, int]]:
    """The GPUs (node, index) a kept entity holds now: a GPU itself, a node's, a process's or a job's."""
    ctx: dict[str, Any] = ent.ctx
    gpus = [ctx["gpu"]] if ent.kind == "gpu" else ctx.get("gpus") or []  # a node's, a process's, a job's
    return [(g.node, g.index) for g in gpus]
