"""Restart recovery: bring back open incidents and snoozes, then settle what changed while no engine ran.

Kept apart from evaluation, as Prometheus keeps `RestoreForState` apart from `Eval`. Restored incidents of
entities not seen yet wait up to `offline_grace` (orphans); those of a rule changed meanwhile close once their
entity is seen (stale); those of a removed rule close at the first step; and a fleet-share limit decides
nothing until the fleet has been observed (three snapshot intervals), its firings deferred till then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from gpuevents.clock import utc
from gpuevents.config import LimitConfig
from rules.core.evaluation import close, evaluate, sweep
from rules.core.incidents import Incident, resolve, transitions
from rules.core.inputs import Snooze, StepResult
from rules.core.limits import LimitWindows
from rules.lang.model import RuleSet

if TYPE_CHECKING:
    from rules.core.core import Core


@dataclass
class Recovery:
    """What a restore left to settle, and when the core started (its first step, or the restore's `now`)."""

    settle_s: float  # how long after the start the fleet counts as observed
    restored: bool = False  # `restore` was called: an engine resuming, which catches up missed cron instants
    restored_at: datetime | None = None
    orphans: set[tuple[str, str]] = field(default_factory=set)  # restored incidents whose entity is not seen yet
    stale: set[tuple[str, str]] = field(default_factory=set)  # restored incidents whose rule changed meanwhile
    removed: list[Incident] = field(default_factory=list)  # restored incidents of rules that no longer exist
    deferred: set[str] = field(default_factory=set)  # rules whose firing waits until the fleet is observed
    fleet_limited: set[str] = field(default_factory=set)  # rules with a destructive action under a fleet share

    def fleet_unobserved(self, rule: str, now: datetime) -> bool:
        """Whether `rule`'s fleet share would be decided on a fleet only partly seen since the restore."""
        return (
            self.restored and rule in self.fleet_limited and self.restored_at is not None
            and (now - self.restored_at).total_seconds() < self.settle_s
        )

    def forget(self, rule: str, key: str) -> None:
        """The (rule, key) incident closed or was dropped: nothing left to settle for it."""
        self.orphans.discard((rule, key))
        self.stale.discard((rule, key))


def fleet_limited(rules: RuleSet, limits: Mapping[str, LimitConfig]) -> set[str]:
    """The rules with a destructive action under a fleet-share limit (its own, or its action type's)."""
    return {
        r.name for r in rules
        if any(a.destructive and (r.spec.limits.max_fleet_pct is not None or (
            a.type in limits and limits[a.type].max_fleet_pct is not None)) for a in r.actions)
    }


def restore(core: Core, incidents: Iterable[Incident], snoozes: Iterable[Snooze], now: datetime | None,
            limits: LimitWindows | None = None) -> None:
    """See `Core.restore`."""
    rec = core.recovery
    if limits is not None:
        core.limiter.restore_windows(limits)
    for inc in incidents:
        if not inc.open:
            continue
        rule = core.rules.by_name.get(inc.rule)
        if rule is None:
            rec.removed.append(inc)
            continue
        if inc.rule_hash and inc.rule_hash not in (rule.hash, rule.legacy_hash):
            rec.stale.add((rule.name, inc.entity_key))
        elif inc.rule_hash != rule.hash:
            inc = inc.model_copy(update={"rule_hash": rule.hash})
        core.incidents[rule.name][inc.entity_key] = inc
        core.by_entity.setdefault(inc.entity_key, set()).add(rule.name)
        if inc.entity_key not in core.state.by_kind[rule.kind]:
            rec.orphans.add((rule.name, inc.entity_key))
    for s in snoozes:
        rule = core.rules.by_name.get(s.rule)
        if s.bounded and rule is not None and now is not None:
            ceiling = utc(now) + timedelta(seconds=rule.snooze_max_s)
            if s.until > ceiling:  # a keep stored while no engine ran: the rule's snooze_max, as when applied
                s = s.model_copy(update={"until": ceiling})
        core.snoozes[(s.rule, s.entity_id)] = s
    rec.restored_at = utc(now) if now is not None else None
    rec.restored = True
    core.timers.full_eval.update(core.rules.by_name)
    rebuild_limits(core)


def rebuild_limits(core: Core) -> None:
    """Count the open incidents for the fleet shares afresh (after a restore or a reload)."""
    core.limiter.reset_matching()
    for name, incs in core.incidents.items():
        rule = core.rules.by_name[name]
        for inc in incs.values():
            core.limiter.set_matching(rule, inc.entity_key, True, core.state.node_key(inc.cluster, inc.node))


def on_step(core: Core, now: datetime, out: StepResult) -> None:
    """At every step: note the first step's instant (the start of a core that was not restored), and close
    the restored incidents of removed rules (no actions: nothing is known of the rule)."""
    rec = core.recovery
    if rec.restored_at is None:
        rec.restored_at = now
    if rec.removed:
        for inc in rec.removed:
            after = resolve(inc, now, "rule_removed")
            out.transitions += transitions(inc, after, "rule_removed")
            out.incidents.append(after)
        rec.removed = []


def check_orphans(core: Core, now: datetime, out: StepResult) -> None:
    """Close restored incidents whose entity did not come back: once its node is known (it reported without
    it), or after `offline_grace`; as `rule_changed` if the rule changed meanwhile, else as `gone`."""
    rec = core.recovery
    if not rec.orphans:
        return
    waited = (now - rec.restored_at).total_seconds() if rec.restored_at else 0.0
    for name, key in list(rec.orphans):
        rule = core.rules.by_name.get(name)
        if rule is None:
            rec.orphans.discard((name, key))
            continue
        if key in core.state.by_kind[rule.kind]:
            rec.orphans.discard((name, key))
            continue
        inc = core.incidents[name].get(key)
        node_known = inc is not None and core.state.node_key(inc.cluster, inc.node) in core.state.nodes
        if node_known or waited >= core.offline_grace_s:
            close(core, rule, key, None, now, "rule_changed" if (name, key) in rec.stale else "gone", out)


def check_stale(core: Core, now: datetime, out: StepResult) -> None:
    """Close restored incidents of rules changed while no engine ran, once their entity is seen; evaluate it
    again under the rule as it is now (an entity not seen is left to `check_orphans`)."""
    rec = core.recovery
    if not rec.stale:
        return
    for name, key in sorted(rec.stale):
        rule = core.rules.by_name.get(name)
        if rule is None or key not in core.incidents[name]:
            rec.stale.discard((name, key))
            continue
        ent = core.state.by_kind[rule.kind].get(key)
        if ent is None:
            continue
        close(core, rule, key, ent, now, "rule_changed", out)
        if not rule.scheduled and (rule.reads_liveness or core.state.online(ent)):
            evaluate(core, rule, (ent,), now, out)


def release_deferred(core: Core, now: datetime, out: StepResult) -> None:
    """Once the fleet has been observed, sweep the rules whose firing was deferred."""
    rec = core.recovery
    if not rec.deferred:
        return
    if rec.restored_at is not None and (now - rec.restored_at).total_seconds() < rec.settle_s:
        return
    for name in sorted(rec.deferred):
        rule = core.rules.by_name.get(name)
        if rule is not None:
            sweep(core, rule, now, out)
    rec.deferred.clear()
