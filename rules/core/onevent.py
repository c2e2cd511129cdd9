"""An event's evaluation: the entities it changed, and for its node what a full evaluation would move anyway.

The fleet state says which entities an event changed and which of their fields (deltas); only the rules that
read a changed field are evaluated for them. What a full re-evaluation of the node would also move is done too,
so that skipping work never changes an outcome: conditions that read the clock, `for`/repeat/stage deadlines
that came due, snoozes and job exemptions that ended, and conditions that raised, for the node's entities and
for the jobs it holds a part of (a repeated snapshot included).
"""

from __future__ import annotations

from datetime import datetime

from gpuevents.events import Event
from rules.core.book import IncidentBook
from rules.core.evaluation import Evaluator
from rules.core.inputs import StepResult
from rules.core.liveness import Liveness
from rules.core.plan import KINDS, RulePlan
from rules.core.state import Change, Entity, FleetState, NodeState
from rules.core.timers import Timers


class EventPath:
    """Applies events to the fleet state and evaluates what they make necessary."""

    def __init__(self, plan: RulePlan, state: FleetState, book: IncidentBook, evaluator: Evaluator,
                 liveness: Liveness, timers: Timers) -> None:
        self.plan = plan
        self.state = state
        self.book = book
        self.evaluator = evaluator
        self.liveness = liveness
        self.timers = timers

    def apply(self, event: Event, now: datetime, out: StepResult) -> None:
        """Apply an event to the fleet state; evaluate the entities it changed, and the rest of its node (and
        jobs) as far as time, deadlines, snoozes and errors ask."""
        state, ev = self.state, self.evaluator
        active = state.jobs.exemptions.active
        # jobs whose exemption ended (dropped at the next tick, or by a rebuild of the job at this very event)
        ended = {job for job, found in active.items() if any(e.until <= now for e in found)} if active else None
        change = state.apply(event, now)
        key = state.node_key(event.cluster, event.node)
        ns = state.nodes.get(key)
        if ns is not None:
            self.liveness.check_online(ns, now, out)
        if change is None:
            if ns is None or not ns.online:
                return
            # An agent's word (it starts or stops) changes no view, but the node is evaluated as at a repeated
            # snapshot (clocks, deadlines that came due while it was offline, snoozes); back online with
            # views not evaluated since it went offline, all of them, as a full evaluation of the node would.
            change = state.refresh(ns) if ns.full_next else Change(key, [], [])
        for e in change.gone:
            ev.close_all(e, now, "gone", out)
        if ns is None:
            return
        if not ns.online:
            ns.skipped()  # not evaluated now: evaluate every entity when it is back
            self.liveness.evaluate_liveness(ns, now, out)
            self._offline_jobs(change.changed, now, out, event.time)
            return
        jobs = state.jobs_of(key)
        by_kind: dict[str, list[Entity]] = {k: [] for k in KINDS}
        for e in change.changed:
            by_kind[e.kind].append(e)
        erroring = ev.take_erroring(key, [j.key for j in jobs])
        if erroring:
            # A condition that raised is evaluated again on every event (errors are counted, not cached).
            fresh = {e.key for e in change.changed}
            for ent in erroring:
                if ent.key not in fresh:
                    by_kind[ent.kind].append(ent)
        deltas = change.deltas
        t = event.time
        for kind, rules in self.plan.event_rules.items():
            ents = by_kind[kind]
            if not ents:
                continue
            # each entity's delta; None: evaluate every rule (new, or its `job` changed: a GPU's or process's
            # `job` decides whether a job's exemption covers it, so every rule reads it)
            pairs = [(e, None if (d := deltas.get(e.key)) is None or "job" in d else d) for e in ents] if deltas else []
            for rule in rules:
                cond = rule.condition
                reads = cond.reads
                if deltas and reads is not None and not cond.time_dependent:
                    # only the entities whose changes this condition reads: the others keep their result
                    sel = [e for e, d in pairs if d is None or not reads.isdisjoint(d)]
                    if sel:
                        ev.evaluate(rule, sel, now, out, t)
                else:
                    ev.evaluate(rule, ents, now, out, t)
        rest = self._rest(ns, jobs, by_kind)
        if self.timers.full_eval:
            # rules new or changed (a reload, a restore) and not swept yet: all of the node's entities, as a
            # full evaluation of the node would (the tick that sweeps them comes at once)
            for kind, rules in self.plan.event_rules.items():
                ents = [*by_kind[kind], *rest[kind]]
                for rule in rules:
                    if rule.name in self.timers.full_eval and not rule.condition.time_dependent and ents:
                        ev.evaluate(rule, ents, now, out, t)
        if self.plan.has_time_rules:
            # Unchanged entities keep their results, except under conditions that read the clock: an event
            # evaluates those for its whole node, as ticks do for the fleet.
            for kind, rules in self.plan.time_rules.items():
                if rest[kind]:
                    for rule in rules:
                        ev.evaluate(rule, rest[kind], now, out, t)
        self._due(ns, jobs, now, out, t)
        if self.book.snoozes:
            self._snoozes_ended([*ns.entities.values(), *jobs], now, out, t)
        if ended:
            self._exemptions_ended([*ns.entities.values(), *jobs], ended, now, out, t)
        exempting = state.jobs.take_exemptions_changed()
        if exempting:
            # a job's annotations changed what it is exempt from: its GPUs and processes on every node
            ev.evaluate_jobs(exempting, now, out, t)

    def _offline_jobs(self, changed: list[Entity], now: datetime, out: StepResult, t: datetime) -> None:
        """Jobs an offline node's event changed (a job across nodes, one of them offline and still reporting):
        evaluated now where their head node is online, as a sweep would; else at the next event of any of
        their nodes, as a full evaluation of that node would."""
        for e in changed:
            if e.kind == "job":
                self.evaluator.evaluate_job(e, now, out, t)

    @staticmethod
    def _rest(ns: NodeState, jobs: list[Entity], done: dict[str, list[Entity]]) -> dict[str, list[Entity]]:
        """The node's entities and jobs that were not evaluated for every rule above, by kind."""
        seen = {e.key for ents in done.values() for e in ents}
        rest: dict[str, list[Entity]] = {k: [] for k in KINDS}
        for e in ns.entities.values():
            if e.key not in seen:
                rest[e.kind].append(e)
        rest["job"] = [j for j in jobs if j.key not in seen]
        return rest

    def _due(self, ns: NodeState, jobs: list[Entity], now: datetime, out: StepResult, t: datetime) -> None:
        """The incidents of the node's entities and jobs whose `for`, stage or repeat came due move on with its
        event, as a full evaluation of the node would have moved them."""
        book, by_name = self.book, self.plan.by_name
        for ent in [*ns.entities.values(), *jobs]:
            if not book.has_any(ent.key):
                continue
            for name in book.rules_on(ent.key):
                due = book.deadline(name, ent.key)
                if due is None or due > now:
                    continue
                rule = by_name[name]
                if not rule.condition.time_dependent:  # those were evaluated above
                    self.evaluator.evaluate(rule, (ent,), now, out, t)

    def _exemptions_ended(self, ents: list[Entity], ended: set[str], now: datetime, out: StepResult,
                          t: datetime) -> None:
        """Entities of the node whose job's exemption ended are evaluated as a full evaluation would evaluate
        them now."""
        for ent in ents:
            job = ent.view.id if ent.kind == "job" else getattr(ent.view, "job", None)
            if job in ended:
                if ent.kind == "job":
                    self.state.jobs.refresh_exemption(ent)  # as a rebuild of the job now would show it
                for rule in self.plan.event_rules[ent.kind]:
                    self.evaluator.evaluate(rule, (ent,), now, out, t)

    def _snoozes_ended(self, ents: list[Entity], now: datetime, out: StepResult, t: datetime) -> None:
        """Entities of the node whose snooze ended (it is lifted at the next tick) are evaluated as a full
        evaluation would evaluate them now."""
        ids = {e.id: e for e in ents}
        for (name, entity_id), s in list(self.book.snoozes.items()):
            ent = ids.get(entity_id)
            if ent is None or s.until > now:
                continue
            rule = self.plan.by_name.get(name)
            if rule is not None and not rule.scheduled and rule.kind == ent.kind:
                self.evaluator.evaluate(rule, (ent,), now, out, t)
