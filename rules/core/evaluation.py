"""Evaluation: test a rule's condition on entities and advance their incidents, in one loop for every caller.

Events (changed entities), ticks (due deadlines, time-dependent sweeps, cron instants) and restart recovery all
go through `evaluate`: snoozed? test the condition (an error counts as false), look up the incident, advance.
Its common case (no snooze, no incident, false) costs one test and one lookup, with no call of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from rules.core.incidents import (
    Incident,
    ResolveReason,
    next_deadline,
    open_incident,
    resolve,
    send_phase,
    step,
    transitions,
)
from rules.core.inputs import EvalProblem, PendingSend, Snooze, StepResult
from rules.core.state import Entity
from rules.lang.model import Rule
from rules.lang.views import EntityView

if TYPE_CHECKING:
    from rules.core.core import Core


def evaluate(
    core: Core, rule: Rule, ents: Iterable[Entity], now: datetime, out: StepResult,
    event_time: datetime | None = None, *, online_only: bool = False, since: datetime | None = None,
) -> None:
    """Evaluate `rule` for each of `ents` at `now` and advance its incidents (a snoozed entity's closes).

    `online_only`: skip entities of offline nodes. `since`: skip entities whose incident was evaluated at or
    after it (a catch-up after a restore). `event_time`: the time of the event that caused this, if any."""
    incs = core.incidents[rule.name]
    test = rule.condition.test
    snoozes = core.snoozes
    exempt = core.state.jobs.exemptions
    nodes = core.state.nodes
    name = rule.name
    for ent in ents:
        if online_only and not nodes[ent.node_key].online:
            continue
        key = ent.key
        if since is not None:
            done = incs.get(key)
            if done is not None and (done.last_eval_at or done.active_at) >= since:
                continue
        if snoozes:
            s = snoozes.get((name, ent.id))
            if s is not None and s.until > now and (not s.entity_key or s.entity_key == key):
                close(core, rule, key, ent, now, "kept" if s.bounded else "snoozed", out, s)
                continue
        if exempt.active and exempt.for_view(ent.view, name, now) is not None:
            close(core, rule, key, ent, now, "exempt", out)
            continue
        try:
            matched = test(ent.ctx)
        except Exception as e:
            matched = False
            record_error(core, rule, ent, e, out)
        before = incs.get(key)
        if before is None and not matched:
            continue
        advance(core, rule, ent, before, matched, now, out, event_time)


def sweep(
    core: Core, rule: Rule, now: datetime, out: StepResult, since: datetime | None = None,
    keys: tuple[str, ...] | None = None,
) -> None:
    """Evaluate `rule` for every entity of its kind on an online node (the hot loop of a tick), or for those
    of `keys` that still exist; with `since`, skip entities whose incident was evaluated at or after it."""
    nodes = core.state.nodes
    online_only = not rule.reads_liveness and any(not ns.online for ns in nodes.values())
    table = core.state.by_kind[rule.kind]
    ents = table.values() if keys is None else [table[k] for k in keys if k in table]
    evaluate(core, rule, ents, now, out, online_only=online_only, since=since)


def advance(
    core: Core, rule: Rule, ent: Entity, before: Incident | None, matched: bool, now: datetime, out: StepResult,
    event_time: datetime | None = None,
) -> None:
    """Move the (rule, entity) incident on by one evaluation: open, promote, repeat or resolve it."""
    if before is None:
        if not matched:
            return
        view: EntityView = ent.ctx["entity"]
        opened = open_incident(rule.name, rule.hash, ent.id, ent.key, rule.kind, view.cluster, view.node, now)
        after = step(opened, True, now, rule.for_s, rule.repeat_s, rule.stages)
    else:
        opened = before
        after = step(before, matched, now, rule.for_s, rule.repeat_s, rule.stages)
        if after is before and not rule.scheduled:
            return
    if after.status == "firing" and opened.status != "firing" and core.recovery.fleet_unobserved(rule.name, now):
        # Since the restore the fleet is only partly seen, so its share would be too high, and a held action is
        # never retried: stay pending; the rule is evaluated again once the fleet has been observed.
        core.recovery.deferred.add(rule.name)
        if before is not None and not rule.scheduled:
            return
        after = opened
    if rule.scheduled and after.open:
        after = after.model_copy(update={"last_eval_at": now})  # persisted: a restart knows what ran
    commit(core, rule, ent, before, after, now, out, event_time=event_time)


def commit(
    core: Core, rule: Rule, ent: Entity | None, before: Incident | None, after: Incident, now: datetime,
    out: StepResult, reason: str = "", event_time: datetime | None = None,
) -> None:
    """Record `after` (index it, count it for the limits, note its deadline) and report the change: its
    transitions, the incident to persist, and the action requests of its send phase, if any."""
    incs = core.incidents[rule.name]
    if after.open:
        incs[after.entity_key] = after
        core.by_entity.setdefault(after.entity_key, set()).add(rule.name)
    else:
        incs.pop(after.entity_key, None)
        unindex(core, after)
    if (before is not None and before.open) != after.open:
        core.limiter.set_matching(rule, after.entity_key, after.open, core.state.node_key(after.cluster, after.node))
    if after.open and not rule.scheduled:
        d = next_deadline(after, rule.for_s, rule.repeat_s, rule.stages)
        if d is not None and d > now:
            core.timers.note_deadline(d)
    if not reason and not after.open:
        reason = after.resolve_reason or ""
    out.transitions += transitions(before, after, reason)
    out.incidents.append(after)
    phase = send_phase(before, after)
    if phase is not None and ent is not None:
        # Decided when the step is over (`Core.flush_sends`), so that a fleet share counts every entity the
        # step found matching, not only those evaluated before this one.
        core.pending_sends.append(PendingSend(rule, ent, after, phase, event_time))


def unindex(core: Core, inc: Incident) -> None:
    """Forget a closed or dropped incident in the per-entity index and in the restore's bookkeeping."""
    rules = core.by_entity.get(inc.entity_key)
    if rules is not None:
        rules.discard(inc.rule)
        if not rules:
            del core.by_entity[inc.entity_key]
    core.recovery.forget(inc.rule, inc.entity_key)


def close_all(core: Core, ent: Entity, now: datetime, reason: ResolveReason, out: StepResult) -> None:
    """Close every open incident of `ent`, whatever its rule."""
    for name in list(core.by_entity.get(ent.key, ())):
        close(core, core.rules.by_name[name], ent.key, ent, now, reason, out)


def close(
    core: Core, rule: Rule, key: str, ent: Entity | None, now: datetime, reason: ResolveReason, out: StepResult,
    snooze: Snooze | None = None,
) -> None:
    """Close the (rule, key) incident, if open, for `reason` (a snooze or keep: who and until when); without
    `ent` no action runs."""
    before = core.incidents[rule.name].get(key)
    if before is None:
        return
    after = resolve(before, now, reason)
    if snooze is not None:
        after = after.model_copy(update={"resolved_by": snooze.by, "kept_until": snooze.until})
    commit(core, rule, ent, before, after, now, out, reason)


def record_error(core: Core, rule: Rule, ent: Entity, e: Exception, out: StepResult) -> None:
    """Count a condition that raised (it is false); report it once per rule and message; have the entity's
    node evaluate it again at its next event, since errors are counted, not cached."""
    core.erroring.setdefault(ent.node_key, {})[ent.key] = None
    message = f"{type(e).__name__}: {e}"
    k = (rule.name, message)
    core.error_counts[k] += 1
    if core.error_counts[k] == 1:
        out.errors.append(EvalProblem(rule=rule.name, entity_id=ent.id, message=message))


def apply_snooze(core: Core, s: Snooze, now: datetime, out: StepResult) -> None:
    """Set (or, with an `until` in the past, lift) a snooze and evaluate its entity at once."""
    rule = core.rules.by_name.get(s.rule)
    ents = [e for e in core.state.by_kind[rule.kind].values() if e.id == s.entity_id] if rule is not None else []
    if s.bounded and rule is not None and s.until > now + timedelta(seconds=rule.snooze_max_s):
        s = s.model_copy(update={"until": now + timedelta(seconds=rule.snooze_max_s)})  # a keep has a ceiling
    if not s.entity_key and len(ents) == 1 and ents[0].key != ents[0].id:
        s = s.model_copy(update={"entity_key": ents[0].key})  # the process as it is now, not its pid
    if s.until <= now:
        core.snoozes.pop((s.rule, s.entity_id), None)
    else:
        core.snoozes[(s.rule, s.entity_id)] = s
    out.snoozes.append(s)
    if rule is None or rule.scheduled:
        return
    evaluate(core, rule, ents, now, out)


def expire_exemptions(core: Core, now: datetime, out: StepResult) -> None:
    """Evaluate again the jobs whose exemption (annotations) ended by `now`, and their GPUs and processes."""
    jobs = set(core.state.jobs.exemptions.expired(now))
    if not jobs:
        return
    for kind, rules in core.event_rules.items():
        ents = [e for e in core.state.by_kind[kind].values() if core.state.online(e) and (
            e.view.id if kind == "job" else getattr(e.view, "job", None)) in jobs]
        for rule in rules:
            evaluate(core, rule, ents, now, out)


def expire_snoozes(core: Core, now: datetime, out: StepResult) -> None:
    """Lift the snoozes that ended by `now` and evaluate their entities (those on online nodes) again."""
    expired = [k for k, s in core.snoozes.items() if s.until <= now]
    for k in expired:
        s = core.snoozes.pop(k)
        out.snoozes.append(s)
        rule = core.rules.by_name.get(s.rule)
        if rule is None or rule.scheduled:
            continue
        ents = [e for e in core.state.by_kind[rule.kind].values() if e.id == s.entity_id and core.state.online(e)]
        evaluate(core, rule, ents, now, out)
