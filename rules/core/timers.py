"""Timers: what a tick evaluates (sweeps, due `for`/repeat/stage deadlines, cron instants and their catch-up).

A tick re-evaluates only what depends on time; everything else keeps the result it had. The due deadlines come
from the incident book's heap (one live entry per open incident with a deadline): a tick looks only at the
incidents that are due, never at all of them.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from rules.core.book import IncidentBook
from rules.core.evaluation import Evaluator
from rules.core.inputs import StepResult
from rules.core.plan import RulePlan
from rules.core.settling import Settling
from rules.core.state import Entity, FleetState
from rules.lang.model import Rule

CATCHUP_GRACE_S = 300.0
"""A cron instant missed during a restart or failover runs late if it is at most this old (or 3 ticks, or 3
lease TTLs, whichever is longer), as APScheduler's misfire_grace_time with coalesce: once, at the latest instant."""


class Timers:
    """When the tick has work: the periodic sweep, each cron rule's next instant and catch-up, rules to sweep in
    full; the earliest incident deadline is the book's."""

    def __init__(self, plan: RulePlan, book: IncidentBook, state: FleetState, evaluator: Evaluator,
                 settling: Settling, *, tick_s: float, lease_ttl_s: float) -> None:
        self.plan = plan
        self.book = book
        self.state = state
        self.evaluator = evaluator
        self.settling = settling
        self.tick_s = tick_s
        self.lease_ttl_s = lease_ttl_s
        self.next_sweep: datetime | None = None
        self.next_cron: dict[str, datetime] = {}
        self.catchup: dict[str, tuple[datetime, datetime]] = {}  # rule -> (missed instant, run at)
        self.full_eval: set[str] = set()  # rules to sweep at the next tick whatever their condition

    @property
    def next_deadline(self) -> datetime | None:
        """The earliest `for`/repeat/stage deadline of an open incident."""
        return self.book.next_deadline()

    def keep_rules(self, names: set[str]) -> None:
        """Drop the cron state of rules that are gone."""
        self.next_cron = {k: v for k, v in self.next_cron.items() if k in names}
        self.catchup = {k: v for k, v in self.catchup.items() if k in names}

    def forget(self, name: str) -> None:
        self.next_cron.pop(name, None)
        self.catchup.pop(name, None)

    def evaluate_in_full(self, names: set[str] | list[str]) -> None:
        """Sweep these rules at the next tick, not up to `engine.tick` later."""
        if names:
            self.full_eval.update(names)
            self.next_sweep = None

    def tick(self, now: datetime, out: StepResult, do_sweep: bool = True) -> None:
        """Cron instants, sweeps and due deadlines. `do_sweep=False`: the periodic sweep is named in `out.sweeps`
        for the caller to run as `Sweep` steps."""
        ev = self.evaluator
        for rule in self.plan:
            if rule.scheduled:
                self._run_cron(rule, now, out)
        swept: set[str] = set()
        if self.next_sweep is None or now >= self.next_sweep:
            for rule in self.plan:
                if not rule.scheduled and (rule.condition.time_dependent or rule.name in self.full_eval):
                    if do_sweep:
                        ev.sweep(rule, now, out)
                        swept.add(rule.name)
                    else:
                        out.sweeps.append(rule.name)
            self.full_eval.clear()
            self.next_sweep = now + timedelta(seconds=self.tick_s)
        due: dict[str, list[Entity]] = {}
        by_name, tables, nodes = self.plan.by_name, self.state.by_kind, self.state.nodes
        for name, key in self.book.pop_due(now):
            due_rule = by_name.get(name)
            if due_rule is None or name in swept:
                continue
            ent = tables[due_rule.kind].get(key)
            if ent is None:
                continue  # a restored incident whose entity is not seen yet: recovery settles it
            if not due_rule.reads_liveness:
                ns = nodes.get(ent.node_key)
                if ns is None or not ns.online:
                    continue  # evaluated when its node is back (an event looks at the node's due deadlines)
            due.setdefault(name, []).append(ent)
        if due:
            for rule in self.plan.timed:  # in the rules' order, as a full evaluation would go
                ents = due.get(rule.name)
                if ents:
                    ev.evaluate(rule, ents, now, out)

    def _run_cron(self, rule: Rule, now: datetime, out: StepResult) -> None:
        """Sweep a scheduled rule at its cron instant, and a missed instant's catch-up when it is time."""
        due_at = self.next_cron.get(rule.name)
        if due_at is None:
            due_at = self.next_cron[rule.name] = rule.next_cron(now - timedelta(seconds=1)) or now
            if self.settling.restored:
                self.plan_catchup(rule, now, due_at)
        if due_at <= now:
            self.catchup.pop(rule.name, None)
            self.evaluator.sweep(rule, now, out)
            nxt = rule.next_cron(now)
            if nxt is not None:
                self.next_cron[rule.name] = nxt
            else:
                self.next_cron.pop(rule.name, None)
        late = self.catchup.get(rule.name)
        if late is not None and now >= late[1]:
            del self.catchup[rule.name]
            self.evaluator.sweep(rule, now, out, since=late[0])

    def plan_catchup(self, rule: Rule, now: datetime, due_at: datetime) -> None:
        """After a restore: the latest cron instant before `now` runs late, once, if it is recent enough. It runs
        when the fleet has been observed (three snapshot intervals after the restore), for the entities whose
        incident was not evaluated at or after it (`last_eval_at`)."""
        missed = rule.last_cron(now)
        if missed is None or missed >= due_at:
            return
        grace = max(CATCHUP_GRACE_S, 3 * self.tick_s, 3 * self.lease_ttl_s)
        if (now - missed).total_seconds() > grace:
            return
        start = self.settling.restored_at or now
        self.catchup[rule.name] = (missed, max(now, start + timedelta(seconds=self.settling.settle_s)))

    def next_wakeup(self, now: datetime) -> datetime:
        """The earliest of: the periodic sweep, an incident deadline, a cron instant or catch-up (may be past)."""
        best = self.next_sweep or now
        d = self.book.next_deadline()
        if d is not None and d < best:
            best = d  # one already due means: tick now
        for rule in self.plan:
            if rule.scheduled:
                nxt = self.next_cron.get(rule.name) or rule.next_cron(now - timedelta(seconds=1))
                if nxt is not None:
                    best = min(best, nxt)
        for _, run_at in self.catchup.values():
            best = min(best, run_at)
        return best
