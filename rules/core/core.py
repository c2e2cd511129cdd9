"""The functional core (DESIGN §1): rules + fleet state + incidents; `step(input, now) -> StepResult`.

No I/O, and time is always an argument. Events are evaluated at once for the entities they change; a tick
re-evaluates only conditions that depend on time, due `for` deadlines and repeats, cron instants, offline
nodes and snoozes. Everything else keeps the result it had: an open incident *is* the cached "true".

`Core` is a composition of owners, each constructed with what it needs and changing only its own state: the
fleet state, the incident book (incidents, per-entity index, deadlines, snoozes), the evaluator, liveness,
timers and recovery. `Core` dispatches inputs to them and holds the rules.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

from gpuevents.clock import utc
from gpuevents.config import Config
from gpuevents.events import JobEndedEvent
from rules.core.book import IncidentBook
from rules.core.evaluation import Evaluator
from rules.core.incidents import Incident, ResolveReason
from rules.core.inputs import BatchResult, CoreInput, EvalProblem, ForgetNode, Snooze, StepResult, Sweep, Tick
from rules.core.limits import Limiter, LimitWindows
from rules.core.liveness import OFFLINE_AFTER_INTERVALS, Liveness
from rules.core.onevent import EventPath
from rules.core.plan import RulePlan
from rules.core.recovery import Recovery, fleet_limited
from rules.core.sends import Sender
from rules.core.settling import Settling
from rules.core.state import Entity, FleetState
from rules.core.timers import Timers
from rules.core.warning_ledger import ActionOutcome, WarningLedger
from rules.lang.model import RuleSet
from rules.lang.views import EvalClock, GpuView, NodeView, ProcessView

__all__ = ["ActionOutcome", "Core", "CoreInput", "EvalProblem", "ForgetNode", "Snooze", "StepResult", "Sweep",
           "Tick"]


class Core:
    """Rules, fleet state and incidents, advanced only by `step`."""

    def __init__(
        self, rules: RuleSet, config: Config | None = None, *, offline_detection: bool = True,
    ) -> None:
        self.config = config or Config()
        engine = self.config.engine
        self.clock = EvalClock()
        self.tick_s = float(engine.tick)
        self.snapshot_interval_s = float(self.config.agent.snapshot_interval)
        self.offline_grace_s = float(engine.offline_grace)
        self.plan = RulePlan()
        self.state = FleetState(self.clock, self.config.cluster, self.config.owners)
        self.book = IncidentBook()
        self.warnings = WarningLedger(self.book)
        self.limiter = Limiter(engine.limits)
        self.sender = Sender(self.config, self.limiter)
        self.settling = Settling(settle_s=OFFLINE_AFTER_INTERVALS * self.snapshot_interval_s)
        self.evaluator = Evaluator(self.plan, self.book, self.state, self.limiter, self.settling)
        self.liveness = Liveness(self.plan, self.state, self.book, self.evaluator, detection=offline_detection,
                                 snapshot_interval_s=self.snapshot_interval_s, offline_grace_s=self.offline_grace_s)
        self.timers = Timers(self.plan, self.book, self.state, self.evaluator, self.settling, tick_s=self.tick_s,
                             lease_ttl_s=float(engine.lease_ttl))
        self.recovery = Recovery(self.plan, self.book, self.state, self.limiter, self.evaluator, self.settling,
                                 offline_grace_s=self.offline_grace_s)
        self.events = EventPath(self.plan, self.state, self.book, self.evaluator, self.liveness, self.timers)
        self._set_rules(rules)

    # ------------------------------------------------------------------ rules
    @property
    def rules(self) -> RuleSet:
        return self.plan.rules

    def _set_rules(self, rules: RuleSet) -> None:
        self.plan.set(rules)
        for r in rules:
            self.book.add_rule(r.name)
        self.timers.keep_rules(set(rules.by_name))
        self.settling.fleet_limited = fleet_limited(rules, self.config.engine.limits)

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
        for name in self.book.rule_names():
            new = rules.by_name.get(name)
            old = self.plan.by_name.get(name)
            if new is not None and old is not None and new.hash == old.hash:
                continue
            if old is not None:
                reason: ResolveReason = "rule_removed" if new is None else "rule_changed"
                table = self.state.by_kind[old.kind]
                for key in list(self.book.of_rule(name)):
                    self.evaluator.close(old, key, table.get(key), now, reason, out)
            for inc in self.book.drop_rule(name):
                self.settling.forget(inc.rule, inc.entity_key)
            self.timers.forget(name)
        self.timers.evaluate_in_full([r.name for r in rules if (old := self.plan.by_name.get(r.name)) is None
                                      or old.hash != r.hash])
        self._set_rules(rules)
        self.recovery.rebuild_limits()
        self.flush_sends(now, out)
        out.limits = self.take_limits(now)
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
        self.recovery.restore(incidents, snoozes, now, limits)
        self.timers.evaluate_in_full(list(self.plan.by_name))

    # ------------------------------------------------------------------ reading (read only)
    @property
    def incidents(self) -> Mapping[str, Mapping[str, Incident]]:
        """Open incidents by rule and entity key (read only: the book owns them)."""
        return self.book.incidents

    @property
    def snoozes(self) -> Mapping[tuple[str, str], Snooze]:
        """Snoozes by (rule, entity id) (read only: the book owns them)."""
        return self.book.snoozes

    @property
    def error_counts(self) -> Counter[tuple[str, str]]:
        return self.evaluator.error_counts

    def nodes(self) -> list[NodeView]:
        return [e.view for e in self.state.by_kind["node"].values()]

    def gpus(self) -> list[GpuView]:
        return [e.view for e in self.state.by_kind["gpu"].values()]

    def processes(self) -> list[ProcessView]:
        return [e.view for e in self.state.by_kind["process"].values()]

    def open_incidents(self) -> list[Incident]:
        return list(self.book)

    def entity(self, key: str) -> Entity | None:
        for table in self.state.by_kind.values():
            e = table.get(key)
            if e is not None:
                return e
        return None

    def next_wakeup(self, now: datetime) -> datetime:
        """When to send the next Tick: the periodic sweep, a cron instant, a `for` or repeat deadline, a snooze or
        a job's exemption ending, a node going offline or past its grace; never before `now`."""
        now = utc(now)
        best = self.timers.next_wakeup(now)
        for at in (self.recovery.next_release(), self.book.next_snooze_end(), self.liveness.next_change(now),
                   self.state.jobs.exemptions.next_end()):
            if at is not None and at < best:
                best = at
        return max(best, now)

    # ------------------------------------------------------------------ step
    def step(self, item: CoreInput, now: datetime) -> StepResult:
        """Advance by one input at `now` (aware)."""
        out = self._step(item, now)
        out.limits = self.take_limits(now)
        return out

    def step_batch(self, items: Iterable[tuple[CoreInput, datetime]],
                   after: Callable[[CoreInput, datetime], None] | None = None) -> BatchResult:
        """Advance by each input at its time, in order, as one batch: the results added up, the rate-limit windows
        taken once at its end (copying every window at every step that ran an action is quadratic at a big
        fleet's start). `after` is called after each input that was applied. An input the core cannot digest is
        left out, with its error, and the batch goes on."""
        total = StepResult()
        failed: list[tuple[int, Exception]] = []
        last: datetime | None = None
        for i, (item, now) in enumerate(items):
            last = now
            try:
                total.extend(self._step(item, now))
            except Exception as e:  # a schema-valid input the core cannot digest: the caller says what to do
                failed.append((i, e))
                continue
            if after is not None:
                after(item, now)
        if last is not None:
            total.limits = self.take_limits(last)
        return BatchResult(total, failed)

    def _step(self, item: CoreInput, now: datetime) -> StepResult:
        now = utc(now)
        self.clock.set(now)
        out = StepResult()
        self.recovery.on_step(now, out)
        if isinstance(item, Tick):
            self._tick(now, out, item.sweep)
        elif isinstance(item, Sweep):
            rule = self.plan.by_name.get(item.rule)
            if rule is not None and not rule.scheduled and item.rule_hash in ("", rule.hash):
                self.evaluator.sweep(rule, now, out, keys=item.keys)
        elif isinstance(item, Snooze):
            self.evaluator.apply_snooze(item, now, out)
        elif isinstance(item, ForgetNode):
            self.liveness.forget(self.state.node_key(item.cluster, item.node), now, out)
        elif isinstance(item, ActionOutcome):
            if item.slot_freed:
                self.limiter.give_back(item.rule, item.action_type, now.timestamp())
            self.warnings.apply_outcome(item, out)
        elif isinstance(item, JobEndedEvent):
            # the job's one occasion: its rules see `ended_at` and `summary` once, then it is gone
            ended = self.state.ended_job(item)
            for rule in self.plan.event_rules["job"]:
                self.evaluator.evaluate(rule, [ended], now, out, item.time)
            self.evaluator.close_all(ended, now, "gone", out)
            for live in self.state.entities_by_id("job", ended.id):
                # a job its nodes still list (the ending raced a snapshot): evaluated anew
                self.evaluator.evaluate_job(live, now, out, item.time)
        else:
            self.events.apply(item, now, out)
        self.flush_sends(now, out)
        return out

    def _tick(self, now: datetime, out: StepResult, do_sweep: bool) -> None:
        """Time passed: nodes offline or gone, restored incidents, snoozes, cron instants, sweeps and deadlines."""
        self.liveness.check_nodes(now, out)
        self.recovery.on_tick(now, out)
        self.evaluator.expire_snoozes(now, out)
        self.evaluator.expire_exemptions(now, out)
        self.recovery.release_deferred(now, out)
        self.timers.tick(now, out, do_sweep)

    def flush_sends(self, now: datetime, out: StepResult) -> None:
        """Render and decide the requests of the send phases this step made due, now that every entity it
        evaluated is counted in the fleet shares."""
        sends = self.evaluator.take_sends()
        if sends:
            totals = {k: len(v) for k, v in self.state.by_kind.items()}
            for p in sends:
                requests = self.sender.requests(p.rule, p.entity, p.incident, p.phase, now, totals, p.event_time)
                out.actions += requests
                self.warnings.record_sent(p, requests, out)

    def take_limits(self, now: datetime) -> LimitWindows | None:
        """The rate-limit windows as of `now` if steps changed them since they were last reported, else None."""
        return self.limiter.windows(utc(now).timestamp()) if self.limiter.dirty else None
