"""Evaluation: test a rule's condition on entities and advance their incidents, in one loop for every caller.

Events (changed entities), ticks (due deadlines, time-dependent sweeps, cron instants) and restart recovery all
go through `Evaluator.evaluate`: snoozed? test the condition (an error counts as false), look up the incident,
advance. Its common case (no snooze, no incident, false) costs one test and one lookup, with no call of its own.
The evaluator records through the incident book, the limiter's fleet shares and the restart bookkeeping; what it
keeps itself is the step's send phases (decided at its end) and the count of conditions that raised.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta

from rules.core.book import IncidentBook
from rules.core.incidents import Incident, ResolveReason, open_incident, resolve, send_phase, step, transitions
from rules.core.inputs import EvalProblem, PendingSend, Snooze, StepResult
from rules.core.limits import Limiter
from rules.core.plan import RulePlan
from rules.core.settling import Settling
from rules.core.state import Entity, FleetState
from rules.lang.model import Rule
from rules.lang.views import EntityView


class Evaluator:
    """Evaluates rules on entities and records what follows; see the module's docstring."""

    def __init__(self, plan: RulePlan, book: IncidentBook, state: FleetState, limiter: Limiter,
                 settling: Settling) -> None:
        self.plan = plan
        self.book = book
        self.state = state
        self.limiter = limiter
        self.settling = settling
        self.pending_sends: list[PendingSend] = []  # send phases due this step, decided at its end
        self.error_counts: Counter[tuple[str, str]] = Counter()
        self.erroring: dict[str, dict[str, str]] = {}  # node key -> key -> kind of entities whose evaluation raised
        self.erroring_jobs: set[str] = set()  # jobs evaluated again at any of their nodes' next event (their
        # evaluation raised, or an offline node changed them)

    def take_sends(self) -> list[PendingSend]:
        sends, self.pending_sends = self.pending_sends, []
        return sends

    def take_erroring(self, node_key: str, job_keys: Iterable[str] = ()) -> list[Entity]:
        """The entities of the node (and of its jobs) whose evaluation raised: they are evaluated again."""
        out: list[Entity] = []
        tables = self.state.by_kind
        for key, kind in self.erroring.pop(node_key, {}).items():
            e = tables[kind].get(key)
            if e is not None:
                out.append(e)
        if self.erroring_jobs:
            for key in job_keys:
                if key in self.erroring_jobs:
                    self.erroring_jobs.discard(key)
                    e = tables["job"].get(key)
                    if e is not None:
                        out.append(e)
        return out

    def evaluate_job(self, job: Entity, now: datetime, out: StepResult, event_time: datetime | None = None) -> None:
        """Every rule on the job now if its head node is online (as a sweep would), else at the next event of any
        of its nodes (as a full evaluation of that node would)."""
        if self.state.evaluable(job):
            for rule in self.plan.event_rules["job"]:
                self.evaluate(rule, (job,), now, out, event_time)
        else:
            self.erroring_jobs.add(job.key)

    def evaluate(
        self, rule: Rule, ents: Iterable[Entity], now: datetime, out: StepResult,
        event_time: datetime | None = None, *, online_only: bool = False, since: datetime | None = None,
    ) -> None:
        """Evaluate `rule` for each of `ents` at `now` and advance its incidents (a snoozed entity's closes).

        `online_only`: skip entities of offline nodes. `since`: skip entities whose incident was evaluated at or
        after it (a catch-up after a restore). `event_time`: the time of the event that caused this, if any."""
        incs = self.book.of_rule(rule.name)
        test = rule.condition.test
        snoozes = self.book.snoozes
        exempt = self.state.jobs.exemptions
        nodes = self.state.nodes
        name = rule.name
        if since is None and not snoozes and not exempt.active:
            # The common case (every tick's sweep): one test and one lookup an entity. An open incident that still
            # matches changes only at its deadline (its `for`, next stage or repeat, kept by the book): before it,
            # it is left as it is without a call. `online_only`: entities of offline nodes are skipped (none to
            # evaluate when every node is offline).
            offline = self.state.offline_keys if online_only else None
            if offline:
                for k in offline:
                    nodes[k].skipped()  # their entities are skipped: evaluated in full when they are back
                if len(offline) >= len(nodes):
                    return
            advance = self.advance
            deadlines = self.book.deadlines
            scheduled = rule.scheduled
            for ent in ents:
                if offline and ent.node_key in offline:
                    continue
                try:
                    matched = test(ent.ctx)
                except Exception as e:
                    matched = False
                    self.record_error(rule, ent, e, out)
                key = ent.key
                before = incs.get(key)
                if before is None:
                    if matched:
                        advance(rule, ent, None, True, now, out, event_time)
                elif not matched or scheduled:
                    advance(rule, ent, before, matched, now, out, event_time)
                else:
                    d = deadlines.get((name, key))
                    if (d > now) if d is not None else before.status == "firing":
                        continue  # before its deadline, or firing with none (no repeat, no stage left)
                    advance(rule, ent, before, matched, now, out, event_time)
            return
        for ent in ents:
            if online_only and not nodes[ent.node_key].online:
                nodes[ent.node_key].skipped()  # evaluated in full when it is back
                continue
            key = ent.key
            if since is not None:
                done = incs.get(key)
                if done is not None and (done.last_eval_at or done.active_at) >= since:
                    continue
            if snoozes:
                s = snoozes.get((name, ent.id))
                if s is not None and s.until > now and (not s.entity_key or s.entity_key == key):
                    self.close(rule, key, ent, now, "kept" if s.bounded else "snoozed", out, s)
                    continue
            if exempt.active and exempt.for_view(ent.view, name, now) is not None:
                self.close(rule, key, ent, now, "exempt", out)
                continue
            try:
                matched = test(ent.ctx)
            except Exception as e:
                matched = False
                self.record_error(rule, ent, e, out)
            before = incs.get(key)
            if before is None and not matched:
                continue
            self.advance(rule, ent, before, matched, now, out, event_time)

    def sweep(self, rule: Rule, now: datetime, out: StepResult, since: datetime | None = None,
              keys: tuple[str, ...] | None = None) -> None:
        """Evaluate `rule` for every entity of its kind on an online node (the hot loop of a tick), or for those
        of `keys` that still exist; with `since`, skip entities whose incident was evaluated at or after it."""
        online_only = not rule.reads_liveness and self.state.any_offline
        table = self.state.by_kind[rule.kind]
        ents = table.values() if keys is None else [table[k] for k in keys if k in table]
        self.evaluate(rule, ents, now, out, online_only=online_only, since=since)

    def advance(self, rule: Rule, ent: Entity, before: Incident | None, matched: bool, now: datetime,
                out: StepResult, event_time: datetime | None = None) -> None:
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
        if after.status == "firing" and opened.status != "firing" and self.settling.fleet_unobserved(rule.name, now):
            # Since the restore the fleet is only partly seen, so its share would be too high, and a held action
            # is never retried: stay pending; the rule is evaluated again once the fleet has been observed.
            self.settling.defer(rule.name)
            if before is not None and not rule.scheduled:
                return
            after = opened
        if rule.scheduled and after.open:
            after = after.model_copy(update={"last_eval_at": now})  # persisted: a restart knows what ran
        self.commit(rule, ent, before, after, out, event_time=event_time)

    def commit(self, rule: Rule, ent: Entity | None, before: Incident | None, after: Incident, out: StepResult,
               reason: str = "", event_time: datetime | None = None) -> None:
        """Record `after` (in the book, with its deadline; counted for the limits) and report the change: its
        transitions, the incident to persist, and the action requests of its send phase, if any."""
        self.book.put(rule, after)
        if not after.open:
            self.settling.forget(rule.name, after.entity_key)
        if (before is not None and before.open) != after.open:
            self.limiter.set_matching(rule, after.entity_key, after.open,
                                      self.state.node_key(after.cluster, after.node))
        if not reason and not after.open:
            reason = after.resolve_reason or ""
        out.transitions += transitions(before, after, reason)
        out.incidents.append(after)
        phase = send_phase(before, after)
        if phase is not None and ent is not None:
            # Decided when the step is over (`Core.flush_sends`), so that a fleet share counts every entity the
            # step found matching, not only those evaluated before this one.
            self.pending_sends.append(PendingSend(rule, ent, after, phase, event_time))

    def close_all(self, ent: Entity, now: datetime, reason: ResolveReason, out: StepResult,
                  keep_liveness: bool = False) -> None:
        """Close every open incident of `ent`, whatever its rule (but those reading liveness, if asked)."""
        for name in self.book.rules_on(ent.key):
            rule = self.plan.by_name[name]
            if not (keep_liveness and rule.reads_liveness):
                self.close(rule, ent.key, ent, now, reason, out)

    def close(self, rule: Rule, key: str, ent: Entity | None, now: datetime, reason: ResolveReason,
              out: StepResult, snooze: Snooze | None = None) -> None:
        """Close the (rule, key) incident, if open, for `reason` (a snooze or keep: who and until when); without
        `ent` no action runs."""
        before = self.book.get(rule.name, key)
        if before is None:
            return
        after = resolve(before, now, reason)
        if snooze is not None:
            after = after.model_copy(update={"resolved_by": snooze.by, "kept_until": snooze.until})
        self.commit(rule, ent, before, after, out, reason)

    def record_error(self, rule: Rule, ent: Entity, e: Exception, out: StepResult) -> None:
        """Count a condition that raised (it is false); report it once per rule and message; have the entity's
        node (a job: each of its nodes) evaluate it again at its next event, since errors are not cached."""
        if ent.kind == "job":
            self.erroring_jobs.add(ent.key)
        else:
            self.erroring.setdefault(ent.node_key, {})[ent.key] = ent.kind
        message = f"{type(e).__name__}: {e}"
        k = (rule.name, message)
        self.error_counts[k] += 1
        if self.error_counts[k] == 1:
            out.errors.append(EvalProblem(rule=rule.name, entity_id=ent.id, message=message))

    def apply_snooze(self, s: Snooze, now: datetime, out: StepResult) -> None:
        """Set (or, with an `until` in the past, lift) a snooze and evaluate its entity at once."""
        rule = self.plan.by_name.get(s.rule)
        ents = self.state.entities_by_id(rule.kind, s.entity_id) if rule is not None else []
        if s.bounded and rule is not None and s.until > now + timedelta(seconds=rule.snooze_max_s):
            s = s.model_copy(update={"until": now + timedelta(seconds=rule.snooze_max_s)})  # a keep has a ceiling
        if not s.entity_key and len(ents) == 1 and ents[0].key != ents[0].id:
            s = s.model_copy(update={"entity_key": ents[0].key})  # the process as it is now, not its pid
        if s.until <= now:
            self.book.lift_snooze(s.rule, s.entity_id)
        else:
            self.book.set_snooze(s)
        out.snoozes.append(s)
        if rule is None or rule.scheduled:
            return
        self.evaluate(rule, ents, now, out)

    def expire_exemptions(self, now: datetime, out: StepResult) -> None:
        """Evaluate again the jobs whose exemption (annotations) ended by `now`, and their GPUs and processes."""
        jobs = set(self.state.jobs.exemptions.expired(now))
        if not jobs:
            return
        for ent in self.state.by_kind["job"].values():
            if ent.view.id in jobs:
                self.state.jobs.refresh_exemption(ent)
        self.state.jobs.take_exemptions_changed()
        self.evaluate_jobs(jobs, now, out)

    def evaluate_jobs(self, jobs: set[str], now: datetime, out: StepResult, event_time: datetime | None = None,
                      ) -> None:
        """Evaluate the jobs of these ids and the GPUs and processes that are theirs, on every online node (their
        exemptions changed)."""
        for ent in [e for e in self.state.by_kind["job"].values() if e.view.id in jobs]:
            self.evaluate_job(ent, now, out, event_time)  # (one whose head node is offline: at its next event)
        for kind, rules in self.plan.event_rules.items():
            if kind == "job":
                continue
            ents = [e for e in self.state.by_kind[kind].values()
                    if getattr(e.view, "job", None) in jobs and self.state.evaluable(e)]
            if ents:
                for rule in rules:
                    self.evaluate(rule, ents, now, out, event_time)

    def expire_snoozes(self, now: datetime, out: StepResult) -> None:
        """Lift the snoozes that ended by `now` and evaluate their entities (those on online nodes, or any for a
        rule that reads liveness) again."""
        for s in self.book.snoozes_ended(now):
            out.snoozes.append(s)
            rule = self.plan.by_name.get(s.rule)
            if rule is None or rule.scheduled:
                continue
            ents = [e for e in self.state.entities_by_id(rule.kind, s.entity_id)
                    if rule.reads_liveness or self.state.evaluable(e)]  # liveness rules see offline nodes too
            self.evaluate(rule, ents, now, out)
