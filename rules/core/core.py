"""The functional core (DESIGN §1): rules + fleet state + incidents; `step(input, now) -> StepResult`.

No I/O, and time is always an argument. Events are evaluated at once for the entities they change; a tick
re-evaluates only conditions that depend on time, due `for` deadlines and repeats, cron instants, offline
nodes and snoozes. Everything else keeps the result it had: an open incident *is* the cached "true".
`Core` holds the state and dispatches; evaluation, timers, liveness and recovery are modules of their own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import datetime

from gpuevents.clock import utc
from gpuevents.config import Config
from gpuevents.events import Event, JobEndedEvent
from rules.core import recovery, timers, warnings
from rules.core.evaluation import apply_snooze, close, close_all, evaluate, sweep, unindex
from rules.core.incidents import Incident, ResolveReason, next_deadline
from rules.core.inputs import CoreInput, EvalProblem, ForgetNode, PendingSend, Snooze, StepResult, Sweep, Tick
from rules.core.limits import Limiter, LimitWindows
from rules.core.liveness import OFFLINE_AFTER_INTERVALS, check_online, evaluate_liveness
from rules.core.recovery import Recovery
from rules.core.sends import Sender
from rules.core.state import Entity, FleetState, NodeState
from rules.core.timers import Timers
from rules.core.warnings import ActionOutcome
from rules.lang.model import Rule, RuleSet
from rules.lang.views import EvalClock, GpuView, NodeView, ProcessView

__all__ = ["ActionOutcome", "Core", "CoreInput", "EvalProblem", "ForgetNode", "Snooze", "StepResult", "Sweep",
           "Tick"]


class Core:
    """Rules, fleet state and incidents, advanced only by `step`."""

    def __init__(
        self, rules: RuleSet, config: Config | None = None, *, offline_detection: bool = True,
    ) -> None:
        self.config = config or Config()
        self.clock = EvalClock()
        self.state = FleetState(self.clock, self.config.cluster, self.config.owners)
        self.limiter = Limiter(self.config.engine.limits)
        self.sender = Sender(self.config, self.limiter)
        self.offline_detection = offline_detection
        self.tick_s = float(self.config.engine.tick)
        self.snapshot_interval_s = float(self.config.agent.snapshot_interval)
        self.offline_grace_s = float(self.config.engine.offline_grace)
        self.incidents: dict[str, dict[str, Incident]] = {}  # rule -> entity key -> the open incident
        self.snoozes: dict[tuple[str, str], Snooze] = {}
        self.error_counts: Counter[tuple[str, str]] = Counter()
        self.by_entity: dict[str, set[str]] = {}  # entity key -> rules with an open incident on it
        self.erroring: dict[str, dict[str, None]] = {}  # node key -> keys of entities whose evaluation raised
        self.timers = Timers()
        self.recovery = Recovery(settle_s=OFFLINE_AFTER_INTERVALS * self.snapshot_interval_s)
        self.rules = RuleSet()
        self.event_rules: dict[str, list[Rule]] = {}  # kind -> rules evaluated on events (not scheduled)
        self.time_rules: dict[str, list[Rule]] = {}  # kind -> those of event_rules whose condition reads the clock
        self.has_time_rules = False
        self.liveness_rules: list[Rule] = []
        self.pending_sends: list[PendingSend] = []  # send phases due this step, decided at its end
        self._set_rules(rules)

    # ------------------------------------------------------------------ rules
    def _set_rules(self, rules: RuleSet) -> None:
        self.rules = rules
        self.event_rules = {"node": [], "gpu": [], "process": [], "job": []}
        for r in rules:
            self.incidents.setdefault(r.name, {})
            if not r.scheduled:
                self.event_rules[r.kind].append(r)
        self.time_rules = {k: [r for r in v if r.condition.time_dependent] for k, v in self.event_rules.items()}
        self.has_time_rules = any(self.time_rules.values())
        self.liveness_rules = [r for r in rules if r.reads_liveness and not r.scheduled]
        self.timers.keep_rules(rules.by_name)
        self.recovery.fleet_limited = recovery.fleet_limited(rules, self.config.engine.limits)

    def replace_rules(self, rules: RuleSet, now: datetime | None = None) -> StepResult:
        """Switch to a new, valid set at `now` (default: the last step's instant). Incidents of unchanged rules
        (same hash: description and labels do not count) stay. Those of changed or removed rules close through
        the normal path, as `rule_changed` / `rule_removed`: the result has their transitions (audit them), the
        OLD rule's `on_resolve` requests for firing ones, and the closed incidents (persist them). New and
        changed rules are evaluated in full at the next tick."""
        if now is not None:
            self.clock.set(utc(now))
        now = self.clock.utc
        out = StepResult()
        for name, incs in list(self.incidents.items()):
            new = rules.by_name.get(name)
            old = self.rules.by_name.get(name)
            if new is not None and old is not None and new.hash == old.hash:
                continue
            if old is not None:
                reason: ResolveReason = "rule_removed" if new is None else "rule_changed"
                table = self.state.by_kind[old.kind]
                for key in list(incs):
                    close(self, old, key, table.get(key), now, reason, out)
            for inc in incs.values():
                unindex(self, inc)
            del self.incidents[name]
            self.timers.forget(name)
        for r in rules:
            old = self.rules.by_name.get(r.name)
            if old is None or old.hash != r.hash:
                self.timers.evaluate_in_full(r.name)
        self._set_rules(rules)
        recovery.rebuild_limits(self)
        self.flush_sends(now, out)
        return out

    def restore(self, incidents: Iterable[Incident], snoozes: Iterable[Snooze] = (),
                now: datetime | None = None, limits: LimitWindows | None = None) -> None:
        """Resume after a restart: open incidents of known, unchanged rules come back as they were (a pending one
        keeps its start, a firing one is not fired again); entities not yet seen get `offline_grace` to reappear.

        Incidents of a rule changed while no engine ran close as `rule_changed` at the first tick that sees
        their entity (with the rule's `on_resolve`: the old rule is not known any more), or when it does not come
        back; those of a removed rule close as `rule_removed` with the next step's result (no actions: nothing
        is known of the rule). Missed cron instants are caught up (see `timers.CATCHUP_GRACE_S`). The rate-limit
        windows continue from `limits`."""
        recovery.restore(self, incidents, snoozes, now, limits)

    # ------------------------------------------------------------------ reading
    def nodes(self) -> list[NodeView]:
        return [e.view for e in self.state.by_kind["node"].values()]

    def gpus(self) -> list[GpuView]:
        return [e.view for e in self.state.by_kind["gpu"].values()]

    def processes(self) -> list[ProcessView]:
        return [e.view for e in self.state.by_kind["process"].values()]

    def open_incidents(self) -> list[Incident]:
        return [i for incs in self.incidents.values() for i in incs.values()]

    def entity(self, key: str) -> Entity | None:
        for table in self.state.by_kind.values():
            e = table.get(key)
            if e is not None:
                return e
        return None

    def next_wakeup(self, now: datetime) -> datetime:
        """When to send the next Tick (see `timers.next_wakeup`); never before `now`."""
        return timers.next_wakeup(self, now)

    # ------------------------------------------------------------------ step
    def step(self, item: CoreInput, now: datetime) -> StepResult:
        """Advance by one input at `now` (aware)."""
        now = utc(now)
        self.clock.set(now)
        out = StepResult()
        recovery.on_step(self, now, out)
        if isinstance(item, Tick):
            timers.tick(self, now, out, do_sweep=item.sweep)
        elif isinstance(item, Sweep):
            rule = self.rules.by_name.get(item.rule)
            if rule is not None and not rule.scheduled and item.rule_hash in ("", rule.hash):
                sweep(self, rule, now, out, keys=item.keys)
        elif isinstance(item, Snooze):
            apply_snooze(self, item, now, out)
        elif isinstance(item, ForgetNode):
            for e in self.state.remove_node(self.state.node_key(item.cluster, item.node)):
                close_all(self, e, now, "gone", out)
        elif isinstance(item, ActionOutcome):
            warnings.apply_outcome(self, item, out)
        elif isinstance(item, JobEndedEvent):
            # the job's one occasion: its rules see `ended_at` and `summary` once, then it is gone
            ended = self.state.ended_job(item)
            for rule in self.event_rules["job"]:
                evaluate(self, rule, [ended], now, out, item.time)
            close_all(self, ended, now, "gone", out)
        else:
            self._event(item, now, out)
        self.flush_sends(now, out)
        return out

    def flush_sends(self, now: datetime, out: StepResult) -> None:
        """Render and decide the requests of the send phases this step made due, now that every entity it
        evaluated is counted in the fleet shares; report the rate-limit windows if they changed."""
        if self.pending_sends:
            sends, self.pending_sends = self.pending_sends, []
            totals = {k: len(v) for k, v in self.state.by_kind.items()}
            for p in sends:
                requests = self.sender.requests(p.rule, p.entity, p.incident, p.phase, now, totals, p.event_time)
                out.actions += requests
                warnings.record_sent(self, p, requests, out)
        if self.limiter.dirty:
            out.limits = self.limiter.windows(now.timestamp())

    def _event(self, event: Event, now: datetime, out: StepResult) -> None:
        """Apply an event to the fleet state; evaluate the entities it changed (and, under conditions that read
        the clock, the rest of its node)."""
        change = self.state.apply(event, now)
        key = self.state.node_key(event.cluster, event.node)
        ns = self.state.nodes.get(key)
        if ns is not None:
            check_online(self, ns, now, out)
        if change is None:
            return
        for e in change.gone:
            close_all(self, e, now, "gone", out)
        if ns is not None and not ns.online:
            ns.full_next = True  # not evaluated now: evaluate every entity when it is back
            evaluate_liveness(self, ns, now, out)
            return
        by_kind: dict[str, list[Entity]] = {"node": [], "gpu": [], "process": [], "job": []}
        for e in change.changed:
            by_kind[e.kind].append(e)
        erroring = self.erroring.pop(change.node_key, None)
        if erroring and ns is not None:
            # A condition that raised is evaluated again on every event (errors are counted, not cached).
            fresh = {e.key for e in change.changed}
            for k in erroring:
                ent = ns.entities.get(k)
                if ent is not None and k not in fresh:
                    by_kind[ent.kind].append(ent)
        deltas = change.deltas
        for kind, rules in self.event_rules.items():
            ents = by_kind[kind]
            if not ents:
                continue
            for rule in rules:
                cond = rule.condition
                reads = cond.reads
                if deltas and reads is not None and not cond.time_dependent:
                    # only the entities whose changes this condition reads: the others keep their result
                    sel = [e for e in ents if (d := deltas.get(e.key)) is None or not reads.isdisjoint(d)]
                    if sel:
                        evaluate(self, rule, sel, now, out, event.time)
                else:
                    evaluate(self, rule, ents, now, out, event.time)
        if ns is not None and self.has_time_rules:
            # Unchanged entities keep their results, except under conditions that read the clock: an event
            # evaluates those for its whole node, as ticks do for the fleet.
            done = {e.key for ents in by_kind.values() for e in ents}
            rest: dict[str, list[Entity]] = {"node": [], "gpu": [], "process": [], "job": []}
            for e in ns.entities.values():
                if e.key not in done:
                    rest[e.kind].append(e)
            for kind, rules in self.time_rules.items():
                if rest[kind]:
                    for rule in rules:
                        evaluate(self, rule, rest[kind], now, out, event.time)
        if ns is not None:
            self._due_on_event(ns, now, out, event.time)

    def _due_on_event(self, ns: NodeState, now: datetime, out: StepResult, event_time: datetime) -> None:
        """The node's incidents whose `for` or repeat came due move on with its event, as a full evaluation of
        the node would have moved them (the tick does the same for nodes without events)."""
        for ent in ns.entities.values():
            names = self.by_entity.get(ent.key)
            if not names:
                continue
            for name in list(names):
                rule = self.rules.by_name[name]
                inc = self.incidents[name].get(ent.key)
                if inc is None or rule.scheduled or rule.condition.time_dependent:
                    continue  # time-dependent rules were evaluated above
                due = next_deadline(inc, rule.for_s, rule.repeat_s, rule.stages)
                if due is not None and due <= now:
                    evaluate(self, rule, [ent], now, out, event_time)
