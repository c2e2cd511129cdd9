"""Timers: what a tick does (sweeps, `for`/repeat deadlines, cron instants and their catch-up) and when the next is.

A tick re-evaluates only what depends on time; everything else keeps the result it had. `next_wakeup` tells the
caller when to send the next `Tick`, so that nothing due waits for the periodic one.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from gpuevents.clock import utc
from rules.core import liveness, recovery
from rules.core.evaluation import evaluate, expire_exemptions, expire_snoozes, sweep
from rules.core.incidents import Incident, next_stage_at
from rules.core.inputs import StepResult
from rules.lang.model import Rule

if TYPE_CHECKING:
    from rules.core.core import Core

CATCHUP_GRACE_S = 300.0
"""A cron instant missed during a restart or failover runs late if it is at most this old (or 3 ticks, or 3
lease TTLs, whichever is longer), as APScheduler's misfire_grace_time with coalesce: once, at the latest instant."""


@dataclass
class Timers:
    """When the tick has work: the periodic sweep, the earliest deadline, each cron rule's next instant."""

    next_sweep: datetime | None = None
    next_deadline: datetime | None = None  # the earliest future `for`/repeat deadline
    next_cron: dict[str, datetime] = field(default_factory=dict)
    catchup: dict[str, tuple[datetime, datetime]] = field(default_factory=dict)  # rule -> (missed instant, run at)
    full_eval: set[str] = field(default_factory=set)  # rules to sweep at the next tick whatever their condition

    def note_deadline(self, d: datetime) -> None:
        if self.next_deadline is None or d < self.next_deadline:
            self.next_deadline = d

    def keep_rules(self, names: Container[str]) -> None:
        """Drop the cron state of rules that are gone."""
        self.next_cron = {k: v for k, v in self.next_cron.items() if k in names}
        self.catchup = {k: v for k, v in self.catchup.items() if k in names}

    def forget(self, name: str) -> None:
        self.next_cron.pop(name, None)
        self.catchup.pop(name, None)

    def evaluate_in_full(self, name: str) -> None:
        """Sweep `name` at the next tick, not up to `engine.tick` later."""
        self.full_eval.add(name)
        self.next_sweep = None


def tick(core: Core, now: datetime, out: StepResult, do_sweep: bool = True) -> None:
    """Time passed: nodes offline or gone, restored incidents, snoozes, cron instants, sweeps and deadlines.

    `do_sweep=False`: the periodic sweep is named in `out.sweeps` for the caller to run as `Sweep` steps."""
    timers = core.timers
    timers.next_deadline = None  # recomputed below, and by every commit
    liveness.check_nodes(core, now, out)
    recovery.check_orphans(core, now, out)
    recovery.check_stale(core, now, out)
    expire_snoozes(core, now, out)
    expire_exemptions(core, now, out)
    recovery.release_deferred(core, now, out)
    for rule in core.rules:
        if rule.scheduled:
            _run_cron(core, rule, now, out)
    swept: set[str] = set()
    if timers.next_sweep is None or now >= timers.next_sweep:
        for rule in core.rules:
            if not rule.scheduled and (rule.condition.time_dependent or rule.name in timers.full_eval):
                if do_sweep:
                    sweep(core, rule, now, out)
                    swept.add(rule.name)
                else:
                    out.sweeps.append(rule.name)
        timers.full_eval.clear()
        timers.next_sweep = now + timedelta(seconds=core.tick_s)
    for rule in core.rules:
        if rule.scheduled or (rule.for_s <= 0 and rule.repeat_s is None and not rule.stages):
            continue
        due_keys, soonest = due(core.incidents[rule.name], rule, now)
        if soonest is not None:
            timers.note_deadline(soonest)
        if rule.name in swept:
            continue
        table = core.state.by_kind[rule.kind]
        ents = [e for e in map(table.get, due_keys) if e is not None and (rule.reads_liveness or core.state.online(e))]
        if ents:
            evaluate(core, rule, ents, now, out)


def _run_cron(core: Core, rule: Rule, now: datetime, out: StepResult) -> None:
    """Sweep a scheduled rule at its cron instant, and a missed instant's catch-up when it is time."""
    timers = core.timers
    due_at = timers.next_cron.get(rule.name)
    if due_at is None:
        due_at = timers.next_cron[rule.name] = rule.next_cron(now - timedelta(seconds=1)) or now
        if core.recovery.restored:
            plan_catchup(core, rule, now, due_at)
    if due_at <= now:
        timers.catchup.pop(rule.name, None)
        sweep(core, rule, now, out)
        nxt = rule.next_cron(now)
        if nxt is not None:
            timers.next_cron[rule.name] = nxt
        else:
            timers.next_cron.pop(rule.name, None)
    late = timers.catchup.get(rule.name)
    if late is not None and now >= late[1]:
        del timers.catchup[rule.name]
        sweep(core, rule, now, out, since=late[0])


def due(incs: dict[str, Incident], rule: Rule, now: datetime) -> tuple[list[str], datetime | None]:
    """The keys of `rule`'s incidents whose `next_deadline` is at or before `now`, and the earliest of the
    others (the hot loop of a tick: each incident's start or last send is compared with `now` less the
    rule's `for` or `repeat`, rather than its deadline worked out)."""
    for_td = timedelta(seconds=rule.for_s) if rule.for_s > 0 else None
    repeat_td = timedelta(seconds=rule.repeat_s) if rule.repeat_s is not None else None
    pending_cut = now - for_td if for_td is not None else None
    repeat_cut = now - repeat_td if repeat_td is not None else None
    keys: list[str] = []
    first_pending: datetime | None = None
    first_sent: datetime | None = None
    for k, inc in incs.items():
        status = inc.status
        if status == "pending":
            if pending_cut is None:
                continue
            start = inc.active_at
            if start <= pending_cut:
                keys.append(k)
            elif first_pending is None or start < first_pending:
                first_pending = start
        elif status == "firing" and repeat_cut is not None:
            sent = inc.last_sent_at
            if sent is None:
                continue
            if sent <= repeat_cut:
                keys.append(k)
            elif first_sent is None or sent < first_sent:
                first_sent = sent
    later = []
    if rule.stages:  # staged actions: each firing incident's next stage
        for k, inc in incs.items():
            at = next_stage_at(inc, rule.stages)
            if at is None:
                continue
            if at <= now:
                if k not in keys:
                    keys.append(k)
            else:
                later.append(at)
    if first_pending is not None and for_td is not None:
        later.append(first_pending + for_td)
    if first_sent is not None and repeat_td is not None:
        later.append(first_sent + repeat_td)
    return keys, min(later) if later else None


def plan_catchup(core: Core, rule: Rule, now: datetime, due_at: datetime) -> None:
    """After a restore: the latest cron instant before `now` runs late, once, if it is recent enough. It runs
    when the fleet has been observed (three snapshot intervals after the restore), for the entities whose
    incident was not evaluated at or after it (`last_eval_at`)."""
    missed = rule.last_cron(now)
    if missed is None or missed >= due_at:
        return
    grace = max(CATCHUP_GRACE_S, 3 * core.tick_s, 3 * float(core.config.engine.lease_ttl))
    if (now - missed).total_seconds() > grace:
        return
    start = core.recovery.restored_at or now
    core.timers.catchup[rule.name] = (missed, max(now, start + timedelta(seconds=core.recovery.settle_s)))


def next_wakeup(core: Core, now: datetime) -> datetime:
    """When to send the next Tick: the periodic sweep, a cron instant, a `for` or repeat deadline, a snooze
    expiring, a node going offline or past its grace; never before `now`."""
    now = utc(now)
    timers = core.timers
    best = timers.next_sweep or now
    if timers.next_deadline is not None and timers.next_deadline < best:
        best = timers.next_deadline  # one already due means: tick now
    for rule in core.rules:
        if rule.scheduled:
            nxt = timers.next_cron.get(rule.name) or rule.next_cron(now - timedelta(seconds=1))
            if nxt is not None:
                best = min(best, nxt)
    for _, run_at in timers.catchup.values():
        best = min(best, run_at)
    rec = core.recovery
    if rec.deferred and rec.restored_at is not None:
        best = min(best, rec.restored_at + timedelta(seconds=rec.settle_s))
    for s in core.snoozes.values():
        best = min(best, s.until)
    for ns in core.state.nodes.values():
        off = liveness.offline_at(core, ns)
        if off is None:
            continue
        if ns.online and off > now:
            best = min(best, off)
        elif not ns.online and ns.offline_since is not None:
            grace_end = ns.offline_since + timedelta(seconds=core.offline_grace_s)
            if grace_end > now:
                best = min(best, grace_end)
    return max(best, now)
