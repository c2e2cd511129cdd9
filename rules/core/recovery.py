"""Restart recovery: bring back open incidents and snoozes, then settle what changed while no engine ran.

Kept apart from evaluation, as Prometheus keeps `RestoreForState` apart from `Eval`. Restored incidents of
entities not seen yet wait up to `offline_grace` (orphans); those of a rule changed meanwhile close once their
entity is seen (stale); those of a removed rule close at the first step; and a fleet-share limit decides
nothing until the fleet has been observed (three snapshot intervals), its firings deferred till then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from gpuevents.clock import utc
from gpuevents.config import LimitConfig
from rules.core.book import IncidentBook
from rules.core.evaluation import Evaluator
from rules.core.incidents import Incident, ResolveReason, resolve, transitions
from rules.core.inputs import Snooze, StepResult
from rules.core.limits import Limiter, LimitWindows
from rules.core.plan import RulePlan
from rules.core.settling import Settling
from rules.core.state import FleetState
from rules.lang.model import RuleSet


def fleet_limited(rules: RuleSet, limits: Mapping[str, LimitConfig]) -> set[str]:
    """The rules with a destructive action under a fleet-share limit (its own, or its action type's)."""
    return {
        r.name for r in rules
        if any(a.destructive and (r.spec.limits.max_fleet_pct is not None or (
            a.type in limits and limits[a.type].max_fleet_pct is not None)) for a in r.actions)
    }


class Recovery:
    """Restores incidents and settles them; its own state is the `Settling` bookkeeping."""

    def __init__(self, plan: RulePlan, book: IncidentBook, state: FleetState, limiter: Limiter,
                 evaluator: Evaluator, settling: Settling, *, offline_grace_s: float) -> None:
        self.plan = plan
        self.book = book
        self.state = state
        self.limiter = limiter
        self.evaluator = evaluator
        self.settling = settling
        self.offline_grace_s = offline_grace_s

    def restore(self, incidents: Iterable[Incident], snoozes: Iterable[Snooze], now: datetime | None,
                limits: LimitWindows | None = None) -> None:
        """See `Core.restore`."""
        rec = self.settling
        if limits is not None:
            self.limiter.restore_windows(limits)
        for inc in incidents:
            if not inc.open:
                continue
            rule = self.plan.by_name.get(inc.rule)
            if rule is None:
                rec.removed.append(inc)
                continue
            if inc.rule_hash and inc.rule_hash not in (rule.hash, rule.legacy_hash):
                rec.stale.add((rule.name, inc.entity_key))
            elif inc.rule_hash != rule.hash:
                inc = inc.model_copy(update={"rule_hash": rule.hash})
            self.book.put(rule, inc)
            if inc.entity_key not in self.state.by_kind[rule.kind]:
                rec.orphans.add((rule.name, inc.entity_key))
        for s in snoozes:
            rule = self.plan.by_name.get(s.rule)
            if s.bounded and rule is not None and now is not None:
                ceiling = utc(now) + timedelta(seconds=rule.snooze_max_s)
                if s.until > ceiling:  # a keep stored while no engine ran: the rule's snooze_max, as when applied
                    s = s.model_copy(update={"until": ceiling})
            self.book.set_snooze(s)
        rec.restored_at = utc(now) if now is not None else None
        rec.restored = True
        self.rebuild_limits()

    def rebuild_limits(self) -> None:
        """Count the open incidents for the fleet shares afresh (after a restore or a reload)."""
        self.limiter.reset_matching()
        for inc in self.book:
            rule = self.plan.by_name[inc.rule]
            self.limiter.set_matching(rule, inc.entity_key, True, self.state.node_key(inc.cluster, inc.node))

    def on_step(self, now: datetime, out: StepResult) -> None:
        """At every step: note the first step's instant (the start of a core that was not restored), and close
        the restored incidents of removed rules (no actions: nothing is known of the rule)."""
        rec = self.settling
        if rec.restored_at is None:
            rec.restored_at = now
        if rec.removed:
            for inc in rec.removed:
                after = resolve(inc, now, "rule_removed")
                out.transitions += transitions(inc, after, "rule_removed")
                out.incidents.append(after)
            rec.removed = []

    def on_tick(self, now: datetime, out: StepResult) -> None:
        self.check_orphans(now, out)
        self.check_stale(now, out)

    def check_orphans(self, now: datetime, out: StepResult) -> None:
        """Close restored incidents whose entity did not come back: once its node is known (it reported without
        it), or after `offline_grace`; as `rule_changed` if the rule changed meanwhile, else as `gone`."""
        rec = self.settling
        if not rec.orphans:
            return
        waited = (now - rec.restored_at).total_seconds() if rec.restored_at else 0.0
        for name, key in list(rec.orphans):
            rule = self.plan.by_name.get(name)
            if rule is None:
                rec.orphans.discard((name, key))
                continue
            if key in self.state.by_kind[rule.kind]:
                rec.orphans.discard((name, key))
                continue
            inc = self.book.get(name, key)
            node_known = inc is not None and self.state.node_key(inc.cluster, inc.node) in self.state.nodes
            if node_known or waited >= self.offline_grace_s:
                reason: ResolveReason = "rule_changed" if (name, key) in rec.stale else "gone"
                self.evaluator.close(rule, key, None, now, reason, out)

    def check_stale(self, now: datetime, out: StepResult) -> None:
        """Close restored incidents of rules changed while no engine ran, once their entity is seen; evaluate it
        again under the rule as it is now (an entity not seen is left to `check_orphans`)."""
        rec = self.settling
        if not rec.stale:
            return
        for name, key in sorted(rec.stale):
            rule = self.plan.by_name.get(name)
            if rule is None or self.book.get(name, key) is None:
                rec.stale.discard((name, key))
                continue
            ent = self.state.by_kind[rule.kind].get(key)
            if ent is None:
                continue
            self.evaluator.close(rule, key, ent, now, "rule_changed", out)
            if not rule.scheduled and (rule.reads_liveness or self.state.evaluable(ent)):
                self.evaluator.evaluate(rule, (ent,), now, out)

    def release_deferred(self, now: datetime, out: StepResult) -> None:
        """Once the fleet has been observed, sweep the rules whose firing was deferred."""
        rec = self.settling
        if not rec.deferred:
            return
        if rec.restored_at is not None and (now - rec.restored_at).total_seconds() < rec.settle_s:
            return
        for name in sorted(rec.deferred):
            rule = self.plan.by_name.get(name)
            if rule is not None:
                self.evaluator.sweep(rule, now, out)
        rec.deferred.clear()

    def next_release(self) -> datetime | None:
        """When deferred firings are released, if any wait."""
        rec = self.settling
        if rec.deferred and rec.restored_at is not None:
            return rec.restored_at + timedelta(seconds=rec.settle_s)
        return None
