"""From an incident that must act to rendered action requests: template names, facts, cost, decisions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from actions import registry
from gpuevents.config import Config
from gpuevents.costs import CostModel
from gpuevents.durations import format_duration
from gpuevents.facts import (
    CostFacts,
    Facts,
    GpuFacts,
    IncidentFacts,
    JobFacts,
    NextFacts,
    NodeFacts,
    ProcessFacts,
)
from gpuevents.protection import protection_reason
from gpuevents.records import ActionRequest, Phase
from rules.core.incidents import Incident
from rules.core.limits import Limiter
from rules.core.nextstep import next_step_words
from rules.core.resolution import resolution_words
from rules.core.state import Entity
from rules.core.warning_ledger import undelivered
from rules.lang.expr import jinja_names
from rules.lang.model import CompiledAction, Rule
from rules.lang.templates import render_params
from rules.lang.views import GpuView, JobView, NodeView, ProcessView


@dataclass(frozen=True, slots=True)
class CostView:
    """`cost` in templates: what the entity's GPUs cost per hour and the estimated waste so far."""

    per_hour: float
    so_far: float
    currency: str
    text: str
    per_hour_text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class TemplateIncident:
    """`incident` in templates (not `gpuevents.wire.fleet.FleetIncident`, a record of the API)."""

    id: str
    status: str
    started_at: datetime
    firing_since: datetime | None
    firing_for: str
    active_for: str
    count: int
    next: NextStage | None = None
    """The next staged action (`type`, `at`, `in`), or None."""
    resolve_reason: str = ""
    """In `on_resolve`: `condition`, `gone`, `snoozed`, `kept`, `rule_changed` or `rule_removed`."""
    resolved_because: str = ""
    """In `on_resolve`, in words: "cleared: …", "kept by alice until 2026-12-03 19:00 UTC", …"""
    resolved_by: str = ""
    kept_until: datetime | None = None


@dataclass(frozen=True, slots=True)
class NextStage:
    """`incident.next`: the next staged action of a firing incident, and when it runs."""

    type: str
    at: datetime
    in_: str
    says: str = ""
    """In words: "in 1 minute this will be logged, unless you keep it"."""

    def __getattr__(self, name: str) -> Any:  # `incident.next.in` in a template (`in` is a Python keyword)
        if name == "in":
            return self.in_
        raise AttributeError(name)


def next_stage(rule: Rule, incident: Incident, now: datetime) -> NextStage | None:
    """The staged action the incident runs next, if any (computed at firing too: fired_at is now)."""
    fired = incident.fired_at or now
    if incident.staged >= len(rule.stages):
        return None
    at = fired + timedelta(seconds=rule.stages[incident.staged])
    actions = rule.stage_actions(incident.staged)
    left = max(0.0, (at - now).total_seconds())
    types = [a.type for a in actions]
    return NextStage(type=", ".join(types), at=at, in_=format_duration(left), says=next_step_words(types, left))


@dataclass(frozen=True, slots=True)
class RuleView:
    """`rule` in templates."""

    name: str
    description: str
    labels: dict[str, str]


def entity_gpus(ent: Entity) -> list[GpuView]:
    v = ent.view
    if isinstance(v, GpuView):
        return [v]
    return list(ent.ctx.get("gpus", []))


def cost_of(model: CostModel, ent: Entity, incident: Incident, now: datetime) -> CostView:
    gpus = entity_gpus(ent)
    per_hour = sum(model.hourly(g.model, g.power_w) for g in gpus)
    v = ent.view
    if isinstance(v, GpuView | JobView) and v.idle:
        seconds = v.idle_for_s
    else:
        seconds = max(0.0, (now - incident.active_at).total_seconds())
    so_far = per_hour * seconds / 3600.0
    return CostView(per_hour=per_hour, so_far=so_far, currency=model.currency, text=model.format(so_far),
                    per_hour_text=model.format(per_hour) + "/h")


def _proc_facts(p: ProcessView) -> ProcessFacts:
    return ProcessFacts.build(
        pid=p.pid, create_time=p.create_time, name=p.name, exe=p.exe, user=p.user, owner=p.owner,
        cmdline=p.cmdline, pod=p.pod, gpus=list(p.gpus), age_s=round(p.age_s, 1), node=p.node, job=p.job,
    )


def _gpu_facts(g: GpuView) -> GpuFacts:
    return GpuFacts.build(
        index=g.index, uuid=g.uuid, model=g.model, util_pct=g.util_pct, mem_used_mib=g.mem_used_mib,
        mem_total_mib=g.mem_total_mib, temp_c=g.temp_c, power_w=g.power_w, idle=g.idle,
        idle_since=g.idle_since, idle_for_s=round(g.idle_for_s, 1), owner=g.owner, node=g.node,
        xid=g.xid, xid_at=g.xid_at, allocated=g.allocated, job=g.job,
    )


def _job_facts(v: JobView) -> JobFacts:
    return JobFacts.build(
        id=v.id, scheduler=v.scheduler, name=v.name, user=v.user, owner=v.owner, account=v.account,
        partition=v.partition, qos=v.qos, namespace=v.namespace, controller=v.controller,
        nodes=None if v.nodes is None else list(v.nodes), gpu_count=v.gpu_count,
        pods=None if v.pods is None else list(v.pods), controller_uid=v.controller_uid,
        controller_generation=v.controller_generation,
        annotations=None if v.annotations is None else dict(v.annotations),
    )


def entity_facts(ent: Entity, **more: Any) -> Facts:
    """What safety checks and messages read about an entity: its node, GPUs, processes, job (and `more`: the
    incident, the cost, who asked)."""
    ctx = ent.ctx
    node: NodeView | None = ctx.get("node")
    out: dict[str, Any] = {
        "node": NodeFacts.build(name=node.name, cluster=node.cluster, labels=dict(node.labels),
                                          online=node.online)
        if node is not None else NodeFacts.build(name=ctx["entity"].node, cluster=ctx["entity"].cluster),
    }
    v = ent.view
    if isinstance(v, GpuView):
        out["gpu"] = _gpu_facts(v)
        out["processes"] = [_proc_facts(p) for p in v.processes]
        out["owners"] = list(v.owners)
    elif isinstance(v, ProcessView):
        out["process"] = _proc_facts(v)
        out["processes"] = [out["process"]]
        out["owners"] = [v.owner] if v.owner else []
        out["gpus"] = [_gpu_facts(g) for g in ctx.get("gpus", [])]
    else:
        if isinstance(v, JobView):
            out["job"] = _job_facts(v)
        gpus = ctx.get("gpus", [])
        out["gpus"] = [_gpu_facts(g) for g in gpus]
        procs = {p.id: p for g in gpus for p in g.processes}
        out["processes"] = [_proc_facts(p) for p in procs.values()]
        out["owners"] = sorted({p.owner for p in procs.values() if p.owner})
    return Facts.build(**out, **more)


def facts_of(ent: Entity, incident: Incident, cost: CostView | None, now: datetime,
             nxt: NextStage | None = None) -> Facts:
    """What messages and safety checks read from a request (gpuevents/facts.py)."""
    more: dict[str, Any] = {"incident": IncidentFacts.build(
        id=incident.id, started_at=incident.active_at, firing_since=incident.fired_at,
        firing_for=incident.firing_for(now), active_for=incident.active_for(now), count=incident.sends,
        next=NextFacts.build(type=nxt.type, at=nxt.at, in_=nxt.in_, says=nxt.says) if nxt else None,
        resolve_reason=incident.resolve_reason, resolved_by=incident.resolved_by or None,
        kept_until=incident.kept_until,
    )}
    if cost is not None:
        more["cost"] = CostFacts.build(amount=round(cost.so_far, 2), currency=cost.currency,
                                                 text=cost.text, per_hour=round(cost.per_hour, 4))
    return entity_facts(ent, **more)


class Sender:
    """Renders and decides the action requests of one phase of one incident."""

    def __init__(self, config: Config, limiter: Limiter) -> None:
        self.config = config
        self.limiter = limiter
        self.costs = CostModel(config.costs)

    def names(self, rule: Rule, ent: Entity, incident: Incident, now: datetime) -> dict[str, Any]:
        names = jinja_names(ent.ctx, rule.tz)
        cost = cost_of(self.costs, ent, incident, now)
        names.update(
            rule=RuleView(name=rule.name, description=rule.spec.description, labels=dict(rule.spec.labels)),
            incident=TemplateIncident(id=incident.id, status=incident.status, started_at=incident.active_at,
                                      firing_since=incident.fired_at, firing_for=incident.firing_for(now),
                                      active_for=incident.active_for(now), count=incident.sends,
                                      next=next_stage(rule, incident, now),
                                      resolve_reason=incident.resolve_reason or "",
                                      resolved_because=resolution_words(incident.resolve_reason,
                                                                        incident.resolved_by, incident.kept_until),
                                      resolved_by=incident.resolved_by, kept_until=incident.kept_until),
            cost=cost,
        )
        return names

    def requests(
        self, rule: Rule, ent: Entity, incident: Incident, phase: Phase, now: datetime, totals: Mapping[str, int],
        event_time: datetime | None = None,
    ) -> list[ActionRequest]:
        """The requests of `phase`; `totals`: entities known of each kind, for the fleet-share limits."""
        if phase == "resolve":
            specs: tuple[CompiledAction, ...] = rule.on_resolve
        elif phase == "stage":
            specs = rule.stage_actions(incident.staged - 1)
        else:  # fire, repeat: the actions that are not staged
            specs = tuple(a for a in rule.actions if a.after_s is None)
        if not specs:
            return []
        names = self.names(rule, ent, incident, now)
        facts = facts_of(ent, incident, names["cost"], now, names["incident"].next)
        dry = rule.spec.dry_run or self.config.engine.dry_run
        out = []
        for a in specs:
            out.append(self._one(rule, ent, incident, phase, a, names, facts, dry, now, totals, event_time))
        return out

    def _held_for_release(self, rule: Rule, a: CompiledAction, req: ActionRequest, why: str,
                          now: datetime) -> ActionRequest:
        """A fleet-share hold, never silent nor forever (DESIGN §3.4): the held actions of one outbreak share one
        question to `engine.holds.channel` (what is held and why); released there, they run (its rate limits
        still apply); unanswered, they end `expired`."""
        rate, why_not = self.limiter.decide_rate(rule, a, now.timestamp())
        if rate != "run":
            return req.model_copy(update={"decision": rate, "reason": why_not})
        since = self.limiter.outbreak(rule.name) or now.timestamp()
        holds = self.config.engine.holds
        self.limiter.record(rule, a, now.timestamp())
        return req.model_copy(update={"approve": holds.channel, "approve_within": holds.approve_within,
                                      "approval_key": f"hold:{rule.name}:{int(since)}", "reason": why})

    def _one(
        self, rule: Rule, ent: Entity, incident: Incident, phase: Phase, a: CompiledAction, names: dict[str, Any],
        facts: Facts, dry: bool, now: datetime, totals: Mapping[str, int], event_time: datetime | None,
    ) -> ActionRequest:
        reason: str | None = None
        params: dict[str, Any] = {}
        try:
            params = render_params(a.params, names)
            registry.parse_params(a.type, params)
        except registry.ParamsError as e:
            reason = f"invalid parameters of action {a.index} ({a.type}) after rendering: {e}"
        except Exception as e:
            reason = f"cannot render the parameters of action {a.index} ({a.type}): {type(e).__name__}: {e}"
        req = ActionRequest(
            key=f"{incident.id}:{phase}:{a.index}:{incident.repeat_count}", type=a.type, params=params,
            rule=rule.name, rule_labels=dict(rule.spec.labels), entity_id=ent.id, entity_kind=rule.kind,
            entity_key=ent.key,
            cluster=ent.ctx["entity"].cluster, node=ent.ctx["entity"].node, incident_id=incident.id, phase=phase,
            index=a.index, repeat=incident.repeat_count, destructive=a.destructive, dry_run=dry,
            decision="refused" if reason else "run", reason=reason, facts=facts, created_at=now,
            event_time=event_time, approve=a.approve, approve_within=a.approve_within_s,
        )
        if reason:
            return req
        if a.destructive:
            why = protection_reason(req, self.config.protect)
            if why is not None:
                return req.model_copy(update={"decision": "refused", "reason": f"protected: {why}"})
            if phase == "stage" and a.require_warning and (unwarned := undelivered(incident)) is not None:
                return req.model_copy(update={"decision": "refused", "reason": unwarned})
        if phase == "resolve" and (not a.destructive or registry.restores(a.type, params)):
            # A restore (uncordon, scale back) is never rate-limited, held or counted: a suppressed one is not
            # retried and would leave the change in place. Other destructive on_resolve actions are limited.
            return req.model_copy(update={"decision": "dry_run", "reason": "dry run"}) if dry else req
        decision, why_not = self.limiter.decide(rule, a, totals, now.timestamp())
        if decision == "held" and self.config.engine.holds.channel and not dry:
            return self._held_for_release(rule, a, req, why_not or "", now)
        if decision != "run":
            return req.model_copy(update={"decision": decision, "reason": why_not})
        if dry:
            return req.model_copy(update={"decision": "dry_run", "reason": "dry run"})
        self.limiter.record(rule, a, now.timestamp())
        return req
