"""The functional core (DESIGN §1): rules + fleet state + incidents; `step(input, now) -> StepResult`.

No I/O, and time is always an argument. Events are evaluated at once for the entities they change; a tick
re-evaluates only conditions that depend on time, due `for` deadlines and repeats, cron instants, offline
nodes and snoozes. Everything else keeps the result it had: an open incident *is* the cached "true".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from gpuevents.clock import utc
from gpuevents.config import Config
from gpuevents.events import Event
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
from rules.core.inputs import CoreInput, EvalProblem, ForgetNode, Snooze, StepResult, Sweep, Tick
from rules.core.limits import Limiter
from rules.core.sends import Sender
from rules.core.state import Entity, FleetState, NodeState
from rules.lang.model import Rule, RuleSet
from rules.lang.views import EntityView, EvalClock, GpuView, NodeView, ProcessView

__all__ = ["Core", "CoreInput", "EvalProblem", "ForgetNode", "Snooze", "StepResult", "Sweep", "Tick", "run_inputs"]

OFFLINE_AFTER_INTERVALS = 3
CATCHUP_GRACE_S = 300.0
"""A cron instant missed during a restart or failover runs late if it is at most this old (or 3 ticks, or 3
lease TTLs, whichever is longer), as APScheduler's misfire_grace_time with coalesce: once, at the latest instant."""


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
        self.incidents: dict[str, dict[str, Incident]] = {}
        self.snoozes: dict[tuple[str, str], Snooze] = {}
        self.error_counts: Counter[tuple[str, str]] = Counter()
        self._by_entity: dict[str, set[str]] = {}
        self._orphans: set[tuple[str, str]] = set()
        self._erroring: dict[str, dict[str, None]] = {}  # node key -> keys of entities whose evaluation raised
        self._restored_at: datetime | None = None
        self._next_sweep: datetime | None = None
        self._next_deadline: datetime | None = None  # the earliest future `for`/repeat deadline
        self._next_cron: dict[str, datetime] = {}
        self._full_eval: set[str] = set()
        self._restored = False  # `restore` was called: an engine resuming, which catches up missed cron instants
        self._settle_s = OFFLINE_AFTER_INTERVALS * self.snapshot_interval_s
        self._catchup: dict[str, tuple[datetime, datetime]] = {}  # rule -> (missed cron instant, when to run it)
        self._stale: set[tuple[str, str]] = set()  # restored incidents whose rule changed while no engine ran
        self._removed: list[Incident] = []  # restored incidents of rules that no longer exist: closed next step
        self._deferred: set[str] = set()  # rules whose firing waits until the fleet is observed after a restore
        self.rules = RuleSet()
        self._set_rules(rules)

    # ------------------------------------------------------------------ rules
    def _set_rules(self, rules: RuleSet) -> None:
        self.rules = rules
        self._event_rules: dict[str, list[Rule]] = {"node": [], "gpu": [], "process": []}
        for r in rules:
            self.incidents.setdefault(r.name, {})
            if not r.scheduled:
                self._event_rules[r.kind].append(r)
        self._time_rules = {k: [r for r in v if r.condition.time_dependent] for k, v in self._event_rules.items()}
        self._has_time_rules = any(self._time_rules.values())
        self._next_cron = {k: v for k, v in self._next_cron.items() if k in rules.by_name}
        self._catchup = {k: v for k, v in self._catchup.items() if k in rules.by_name}
        self._liveness_rules = [r for r in rules if r.reads_liveness and not r.scheduled]
        limits = self.config.engine.limits
        self._fleet_limited = {
            r.name for r in rules
            if any(a.destructive and (r.spec.limits.max_fleet_pct is not None or (
                a.type in limits and limits[a.type].max_fleet_pct is not None)) for a in r.actions)
        }

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
                    self._close(old, key, table.get(key), now, reason, out)
            for inc in incs.values():
                self._unindex(inc)
            del self.incidents[name]
            self._next_cron.pop(name, None)
            self._catchup.pop(name, None)
        for r in rules:
            old = self.rules.by_name.get(r.name)
            if old is None or old.hash != r.hash:
                self._full_eval.add(r.name)
                self._next_sweep = None  # at the next tick, not up to `engine.tick` later
        self._set_rules(rules)
        self._rebuild_limits()
        return out

    # ------------------------------------------------------------------ restore
    def restore(self, incidents: Iterable[Incident], snoozes: Iterable[Snooze] = (), now: datetime | None = None) -> None:
        """Resume after a restart: open incidents of known, unchanged rules come back as they were (a pending one
        keeps its start, a firing one is not fired again); entities not yet seen get `offline_grace` to reappear.

        Incidents of a rule changed while no engine ran close as `rule_changed` at the first tick that sees
        their entity (with the rule's `on_resolve`: the old rule is not known any more), or when it does not come
        back; those of a removed rule close as `rule_removed` with the next step's result (no actions: nothing
        is known of the rule). Missed cron instants are caught up (see CATCHUP_GRACE_S)."""
        for inc in incidents:
            if not inc.open:
                continue
            rule = self.rules.by_name.get(inc.rule)
            if rule is None:
                self._removed.append(inc)
                continue
            if inc.rule_hash and inc.rule_hash not in (rule.hash, rule.legacy_hash):
                self._stale.add((rule.name, inc.entity_key))
            elif inc.rule_hash != rule.hash:
                inc = inc.model_copy(update={"rule_hash": rule.hash})
            self.incidents[rule.name][inc.entity_key] = inc
            self._by_entity.setdefault(inc.entity_key, set()).add(rule.name)
            if inc.entity_key not in self.state.by_kind[rule.kind]:
                self._orphans.add((rule.name, inc.entity_key))
        for s in snoozes:
            self.snoozes[(s.rule, s.entity_id)] = s
        self._restored_at = utc(now) if now is not None else None
        self._restored = True
        self._full_eval.update(self.rules.by_name)
        self._rebuild_limits()

    def _rebuild_limits(self) -> None:
        self.limiter.reset_firing()
        for name, incs in self.incidents.items():
            rule = self.rules.by_name[name]
            for inc in incs.values():
                if inc.status == "firing":
                    self.limiter.set_firing(rule, inc.entity_key, True, self.state.node_key(inc.cluster, inc.node))

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

    # ------------------------------------------------------------------ step
    def step(self, item: CoreInput, now: datetime) -> StepResult:
        """Advance by one input at `now` (aware)."""
        now = utc(now)
        self.clock.set(now)
        out = StepResult()
        if self._restored_at is None:
            self._restored_at = now
        if self._removed:
            for inc in self._removed:
                after = resolve(inc, now, "rule_removed")
                out.transitions += transitions(inc, after, "rule_removed")
                out.incidents.append(after)
            self._removed = []
        if isinstance(item, Tick):
            self._tick(now, out, sweep=item.sweep)
        elif isinstance(item, Sweep):
            rule = self.rules.by_name.get(item.rule)
            if rule is not None and not rule.scheduled and item.rule_hash in ("", rule.hash):
                self._sweep(rule, now, out, keys=item.keys)
        elif isinstance(item, Snooze):
            self._snooze(item, now, out)
        elif isinstance(item, ForgetNode):
            for e in self.state.remove_node(self.state.node_key(item.cluster, item.node)):
                self._close_all(e, now, "gone", out)
        else:
            self._event(item, now, out)
        return out

    def _event(self, event: Event, now: datetime, out: StepResult) -> None:
        change = self.state.apply(event, now)
        key = self.state.node_key(event.cluster, event.node)
        ns = self.state.nodes.get(key)
        if ns is not None:
            self._check_online(ns, now, out)
        if change is None:
            return
        for e in change.gone:
            self._close_all(e, now, "gone", out)
        if ns is not None and not ns.online:
            ns.full_next = True  # not evaluated now: evaluate every entity when it is back
            self._evaluate_liveness(ns, now, out)
            return
        by_kind: dict[str, list[Entity]] = {"node": [], "gpu": [], "process": []}
        for e in change.changed:
            by_kind[e.kind].append(e)
        erroring = self._erroring.pop(change.node_key, None)
        if erroring and ns is not None:
            # A condition that raised is evaluated again on every event (errors are counted, not cached).
            fresh = {e.key for e in change.changed}
            for k in erroring:
                ent = ns.entities.get(k)
                if ent is not None and k not in fresh:
                    by_kind[ent.kind].append(ent)
        for kind, rules in self._event_rules.items():
            ents = by_kind[kind]
            if not ents:
                continue
            for rule in rules:
                for e in ents:
                    self._evaluate(rule, e, now, out, event.time)
        if ns is not None and self._has_time_rules:
            # Unchanged entities keep their results, except under conditions that read the clock: an event
            # evaluates those for its whole node, as ticks do for the fleet.
            done = {e.key for ents in by_kind.values() for e in ents}
            rest: dict[str, list[Entity]] = {"node": [], "gpu": [], "process": []}
            for e in ns.entities.values():
                if e.key not in done:
                    rest[e.kind].append(e)
            for kind, rules in self._time_rules.items():
                if rest[kind]:
                    for rule in rules:
                        self._evaluate_each(rule, rest[kind], now, out, event.time)

    def _snooze(self, s: Snooze, now: datetime, out: StepResult) -> None:
        if s.until <= now:
            self.snoozes.pop((s.rule, s.entity_id), None)
        else:
            self.snoozes[(s.rule, s.entity_id)] = s
        out.snoozes.append(s)
        rule = self.rules.by_name.get(s.rule)
        if rule is None or rule.scheduled:
            return
        for e in self.state.by_kind[rule.kind].values():
            if e.id == s.entity_id:
                self._evaluate(rule, e, now, out)

    def _snoozed(self, rule: str, ent: Entity, now: datetime) -> bool:
        s = self.snoozes.get((rule, ent.id))
        return s is not None and s.until > now

    # ------------------------------------------------------------------ evaluation
    def _evaluate(self, rule: Rule, ent: Entity, now: datetime, out: StepResult, event_time: datetime | None = None) -> None:
        if self.snoozes and self._snoozed(rule.name, ent, now):
            self._close(rule, ent.key, ent, now, "snoozed", out)
            return
        try:
            matched = rule.condition.test(ent.ctx)
        except Exception as e:
            matched = False
            self._error(rule, ent, e, out)
        before = self.incidents[rule.name].get(ent.key)
        self._advance(rule, ent, before, matched, now, out, event_time)

    def _advance(
        self, rule: Rule, ent: Entity, before: Incident | None, matched: bool, now: datetime, out: StepResult,
        event_time: datetime | None = None,
    ) -> None:
        if before is None:
            if not matched:
                return
            view: EntityView = ent.ctx["entity"]
            opened = open_incident(rule.name, rule.hash, ent.id, ent.key, rule.kind, view.cluster, view.node, now)
            after = step(opened, True, now, rule.for_s, rule.repeat_s)
        else:
            opened = before
            after = step(before, matched, now, rule.for_s, rule.repeat_s)
            if after is before and not rule.scheduled:
                return
        if after.status == "firing" and opened.status != "firing" and self._fleet_unobserved(rule, now):
            # Since the restore the fleet is only partly seen, so its share would be too high, and a held action is
            # never retried: stay pending; the rule is evaluated again once the fleet has been observed.
            self._deferred.add(rule.name)
            if before is not None and not rule.scheduled:
                return
            after = opened
        if rule.scheduled and after.open:
            after = after.model_copy(update={"last_eval_at": now})  # persisted: a restart knows what ran
        self._commit(rule, ent, before, after, now, out, event_time=event_time)

    def _fleet_unobserved(self, rule: Rule, now: datetime) -> bool:
        return (
            self._restored and rule.name in self._fleet_limited and self._restored_at is not None
            and (now - self._restored_at).total_seconds() < self._settle_s
        )

    def _commit(
        self, rule: Rule, ent: Entity | None, before: Incident | None, after: Incident, now: datetime,
        out: StepResult, reason: str = "", event_time: datetime | None = None,
    ) -> None:
        incs = self.incidents[rule.name]
        if after.open:
            incs[after.entity_key] = after
            self._by_entity.setdefault(after.entity_key, set()).add(rule.name)
        else:
            incs.pop(after.entity_key, None)
            self._unindex(after)
        if (before is None or before.status != "firing") and after.status == "firing":
            self.limiter.set_firing(rule, after.entity_key, True, self.state.node_key(after.cluster, after.node))
        elif before is not None and before.status == "firing" and after.status != "firing":
            self.limiter.set_firing(rule, after.entity_key, False, self.state.node_key(after.cluster, after.node))
        if after.open and not rule.scheduled:
            d = next_deadline(after, rule.for_s, rule.repeat_s)
            if d is not None and d > now and (self._next_deadline is None or d < self._next_deadline):
                self._next_deadline = d
        if not reason and not after.open:
            reason = after.resolve_reason or ""
        out.transitions += transitions(before, after, reason)
        out.incidents.append(after)
        phase = send_phase(before, after)
        if phase is not None and ent is not None:
            totals = {k: len(v) for k, v in self.state.by_kind.items()}
            out.actions += self.sender.requests(rule, ent, after, phase, now, totals, event_time)

    def _unindex(self, inc: Incident) -> None:
        rules = self._by_entity.get(inc.entity_key)
        if rules is not None:
            rules.discard(inc.rule)
            if not rules:
                del self._by_entity[inc.entity_key]
        self._orphans.discard((inc.rule, inc.entity_key))
        self._stale.discard((inc.rule, inc.entity_key))

    def _close_all(self, ent: Entity, now: datetime, reason: ResolveReason, out: StepResult) -> None:
        for name in list(self._by_entity.get(ent.key, ())):
            self._close(self.rules.by_name[name], ent.key, ent, now, reason, out)

    def _close(self, rule: Rule, key: str, ent: Entity | None, now: datetime, reason: ResolveReason, out: StepResult) -> None:
        before = self.incidents[rule.name].get(key)
        if before is None:
            return
        self._commit(rule, ent, before, resolve(before, now, reason), now, out, reason)

    def _error(self, rule: Rule, ent: Entity, e: Exception, out: StepResult) -> None:
        self._erroring.setdefault(ent.node_key, {})[ent.key] = None
        message = f"{type(e).__name__}: {e}"
        k = (rule.name, message)
        self.error_counts[k] += 1
        if self.error_counts[k] == 1:
            out.errors.append(EvalProblem(rule=rule.name, entity_id=ent.id, message=message))

    # ------------------------------------------------------------------ tick
    def _tick(self, now: datetime, out: StepResult, sweep: bool = True) -> None:
        self._next_deadline = None  # recomputed below, and by every commit
        self._check_nodes(now, out)
        self._check_orphans(now, out)
        self._check_stale(now, out)
        self._expire_snoozes(now, out)
        if self._deferred and not self._restored_at_most(now, self._settle_s):
            for name in sorted(self._deferred):
                rule = self.rules.by_name.get(name)
                if rule is not None:
                    self._sweep(rule, now, out)
            self._deferred.clear()
        for rule in self.rules:
            if rule.scheduled:
                due = self._next_cron.get(rule.name)
                if due is None:
                    due = self._next_cron[rule.name] = rule.next_cron(now - timedelta(seconds=1)) or now
                    if self._restored:
                        self._plan_catchup(rule, now, due)
                if due <= now:
                    self._catchup.pop(rule.name, None)
                    self._sweep(rule, now, out)
                    nxt = rule.next_cron(now)
                    if nxt is not None:
                        self._next_cron[rule.name] = nxt
                    else:
                        self._next_cron.pop(rule.name, None)
                late = self._catchup.get(rule.name)
                if late is not None and now >= late[1]:
                    del self._catchup[rule.name]
                    self._sweep(rule, now, out, since=late[0])
        swept: set[str] = set()
        if self._next_sweep is None or now >= self._next_sweep:
            for rule in self.rules:
                if not rule.scheduled and (rule.condition.time_dependent or rule.name in self._full_eval):
                    if sweep:
                        self._sweep(rule, now, out)
                        swept.add(rule.name)
                    else:
                        out.sweeps.append(rule.name)
            self._full_eval.clear()
            self._next_sweep = now + timedelta(seconds=self.tick_s)
        for rule in self.rules:
            if rule.scheduled or (rule.for_s <= 0 and rule.repeat_s is None):
                continue
            due_keys, soonest = self._due(rule, now)
            if soonest is not None and (self._next_deadline is None or soonest < self._next_deadline):
                self._next_deadline = soonest
            if rule.name in swept:
                continue
            table = self.state.by_kind[rule.kind]
            for k in due_keys:
                ent = table.get(k)
                if ent is not None and (rule.reads_liveness or self._online(ent)):
                    self._evaluate(rule, ent, now, out)

    def _due(self, rule: Rule, now: datetime) -> tuple[list[str], datetime | None]:
        """The keys of `rule`'s incidents whose `next_deadline` is at or before `now`, and the earliest of the
        others (the hot loop of a tick: each incident's start or last send is compared with `now` less the
        rule's `for` or `repeat`, rather than its deadline worked out)."""
        for_td = timedelta(seconds=rule.for_s) if rule.for_s > 0 else None
        repeat_td = timedelta(seconds=rule.repeat_s) if rule.repeat_s is not None else None
        pending_cut = now - for_td if for_td is not None else None
        repeat_cut = now - repeat_td if repeat_td is not None else None
        due: list[str] = []
        first_pending: datetime | None = None
        first_sent: datetime | None = None
        for k, inc in self.incidents[rule.name].items():
            status = inc.status
            if status == "pending":
                if pending_cut is None:
                    continue
                start = inc.active_at
                if start <= pending_cut:
                    due.append(k)
                elif first_pending is None or start < first_pending:
                    first_pending = start
            elif status == "firing" and repeat_cut is not None:
                sent = inc.last_sent_at
                if sent is None:
                    continue
                if sent <= repeat_cut:
                    due.append(k)
                elif first_sent is None or sent < first_sent:
                    first_sent = sent
        later = []
        if first_pending is not None and for_td is not None:
            later.append(first_pending + for_td)
        if first_sent is not None and repeat_td is not None:
            later.append(first_sent + repeat_td)
        return due, min(later) if later else None

    def _restored_at_most(self, now: datetime, seconds: float) -> bool:
        return self._restored_at is not None and (now - self._restored_at).total_seconds() < seconds

    def _plan_catchup(self, rule: Rule, now: datetime, due: datetime) -> None:
        """After a restore: the latest cron instant before `now` runs late, once, if it is recent enough. It runs
        when the fleet has been observed (three snapshot intervals after the restore), for the entities whose
        incident was not evaluated at or after it (`last_eval_at`)."""
        missed = rule.last_cron(now)
        if missed is None or missed >= due:
            return
        grace = max(CATCHUP_GRACE_S, 3 * self.tick_s, 3 * float(self.config.engine.lease_ttl))
        if (now - missed).total_seconds() > grace:
            return
        start = self._restored_at or now
        self._catchup[rule.name] = (missed, max(now, start + timedelta(seconds=self._settle_s)))

    def _evaluate_each(
        self, rule: Rule, ents: list[Entity], now: datetime, out: StepResult, event_time: datetime | None,
    ) -> None:
        """`_evaluate` for each of `ents`, with its common case inline: no snooze, no incident, false."""
        incs = self.incidents[rule.name]
        test = rule.condition.test
        for ent in ents:
            if self.snoozes and self._snoozed(rule.name, ent, now):
                self._evaluate(rule, ent, now, out, event_time)
                continue
            try:
                matched = test(ent.ctx)
            except Exception as e:
                matched = False
                self._error(rule, ent, e, out)
            before = incs.get(ent.key)
            if before is None and not matched:
                continue
            self._advance(rule, ent, before, matched, now, out, event_time)

    def _sweep(self, rule: Rule, now: datetime, out: StepResult, since: datetime | None = None,
               keys: tuple[str, ...] | None = None) -> None:
        """Evaluate `rule` for every entity of its kind on an online node (the hot loop of a tick), or for those
        of `keys` that still exist; with `since`, skip entities whose incident was evaluated at or after it."""
        incs = self.incidents[rule.name]
        test = rule.condition.test
        nodes = self.state.nodes
        skip_offline = not rule.reads_liveness and any(not ns.online for ns in nodes.values())
        snoozes = self.snoozes
        table = self.state.by_kind[rule.kind]
        entities = table.items() if keys is None else ((k, table[k]) for k in keys if k in table)
        for key, ent in entities:
            if skip_offline and not nodes[ent.node_key].online:
                continue
            if since is not None:
                done = incs.get(key)
                if done is not None and (done.last_eval_at or done.active_at) >= since:
                    continue
            if snoozes and self._snoozed(rule.name, ent, now):
                self._close(rule, key, ent, now, "snoozed", out)
                continue
            try:
                matched = test(ent.ctx)
            except Exception as e:
                matched = False
                self._error(rule, ent, e, out)
            before = incs.get(key)
            if before is None and not matched:
                continue
            self._advance(rule, ent, before, matched, now, out)

    def _online(self, ent: Entity) -> bool:
        ns = self.state.nodes.get(ent.node_key)
        return ns is not None and ns.online

    def _interval(self, ns: NodeState) -> float:
        return ns.interval_s or self.snapshot_interval_s

    def _offline_at(self, ns: NodeState) -> datetime | None:
        if not self.offline_detection and not ns.stopping:
            return None
        if ns.stopping:
            return ns.last_seen
        if ns.last_seen is None:
            return None
        return ns.last_seen + timedelta(seconds=OFFLINE_AFTER_INTERVALS * self._interval(ns))

    def _check_online(self, ns: NodeState, now: datetime, out: StepResult) -> None:
        off = self._offline_at(ns)
        online = off is None or now < off
        if online != ns.online:
            self.state.set_online(ns, online, off or now)
            self._evaluate_liveness(ns, now, out)

    def _evaluate_liveness(self, ns: NodeState, now: datetime, out: StepResult) -> None:
        """Node rules that read `online` / `last_seen` see a node go offline (or come back) at once."""
        if self._liveness_rules and ns.node_entity is not None:
            for rule in self._liveness_rules:
                self._evaluate(rule, ns.node_entity, now, out)

    def _check_nodes(self, now: datetime, out: StepResult) -> None:
        gone: list[str] = []
        for key, ns in self.state.nodes.items():
            self._check_online(ns, now, out)
            if not ns.online and ns.offline_since is not None and (
                (now - ns.offline_since).total_seconds() >= self.offline_grace_s
            ):
                gone.append(key)
        for key in gone:
            ns = self.state.nodes[key]
            if self._liveness_open(ns):
                # An "agent down" incident is open: keep the node so that it goes on (and resolves when the node
                # is back, or as gone when it is forgotten); the incidents of other rules end as gone.
                for e in [*ns.entities.values(), *([ns.node_entity] if ns.node_entity is not None else [])]:
                    for name in list(self._by_entity.get(e.key, ())):
                        rule = self.rules.by_name[name]
                        if not rule.reads_liveness:
                            self._close(rule, e.key, e, now, "gone", out)
                continue
            for e in self.state.remove_node(key):
                self._close_all(e, now, "gone", out)

    def _liveness_open(self, ns: NodeState) -> bool:
        if not self._liveness_rules or ns.node_entity is None:
            return False
        names = self._by_entity.get(ns.node_entity.key, ())
        return any(self.rules.by_name[n].reads_liveness for n in names)

    def _check_orphans(self, now: datetime, out: StepResult) -> None:
        if not self._orphans:
            return
        waited = (now - self._restored_at).total_seconds() if self._restored_at else 0.0
        for name, key in list(self._orphans):
            rule = self.rules.by_name.get(name)
            if rule is None:
                self._orphans.discard((name, key))
                continue
            if key in self.state.by_kind[rule.kind]:
                self._orphans.discard((name, key))
                continue
            inc = self.incidents[name].get(key)
            node_known = inc is not None and self.state.node_key(inc.cluster, inc.node) in self.state.nodes
            if node_known or waited >= self.offline_grace_s:
                self._close(rule, key, None, now, "rule_changed" if (name, key) in self._stale else "gone", out)

    def _check_stale(self, now: datetime, out: StepResult) -> None:
        """Close restored incidents of rules changed while no engine ran, once their entity is seen; evaluate it
        again under the rule as it is now (an entity not seen is left to `_check_orphans`)."""
        if not self._stale:
            return
        for name, key in sorted(self._stale):
            rule = self.rules.by_name.get(name)
            if rule is None or key not in self.incidents[name]:
                self._stale.discard((name, key))
                continue
            ent = self.state.by_kind[rule.kind].get(key)
            if ent is None:
                continue
            self._close(rule, key, ent, now, "rule_changed", out)
            if not rule.scheduled and (rule.reads_liveness or self._online(ent)):
                self._evaluate(rule, ent, now, out)

    def _expire_snoozes(self, now: datetime, out: StepResult) -> None:
        expired = [k for k, s in self.snoozes.items() if s.until <= now]
        for k in expired:
            s = self.snoozes.pop(k)
            out.snoozes.append(s)
            rule = self.rules.by_name.get(s.rule)
            if rule is None or rule.scheduled:
                continue
            for e in self.state.by_kind[rule.kind].values():
                if e.id == s.entity_id and self._online(e):
                    self._evaluate(rule, e, now, out)

    # ------------------------------------------------------------------ timers
    def next_wakeup(self, now: datetime) -> datetime:
        """When to send the next Tick: the periodic sweep, a cron instant, a `for` or repeat deadline, a snooze
        expiring, a node going offline or past its grace; never before `now`."""
        now = utc(now)
        best = self._next_sweep or now
        if self._next_deadline is not None and now < self._next_deadline < best:
            best = self._next_deadline
        for rule in self.rules:
            if rule.scheduled:
                nxt = self._next_cron.get(rule.name) or rule.next_cron(now - timedelta(seconds=1))
                if nxt is not None:
                    best = min(best, nxt)
        for _, run_at in self._catchup.values():
            best = min(best, run_at)
        if self._deferred and self._restored_at is not None:
            best = min(best, self._restored_at + timedelta(seconds=self._settle_s))
        for s in self.snoozes.values():
            best = min(best, s.until)
        for ns in self.state.nodes.values():
            off = self._offline_at(ns)
            if off is None:
                continue
            if ns.online and off > now:
                best = min(best, off)
            elif not ns.online and ns.offline_since is not None:
                grace_end = ns.offline_since + timedelta(seconds=self.offline_grace_s)
                if grace_end > now:
                    best = min(best, grace_end)
        return max(best, now)


def run_inputs(core: Core, inputs: Sequence[tuple[datetime, CoreInput]]) -> StepResult:
    """Step through timed inputs in order; the combined result."""
    total = StepResult()
    for t, item in inputs:
        total.extend(core.step(item, t))
    return total
