"""Limits and safety (DESIGN §3.4): rolling-hour rates, fleet-share holds, per rule and per action type."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from gpuevents.config import LimitConfig
from gpuevents.records import Decision
from rules.lang.model import CompiledAction, Rule

HOUR_S = 3600.0


def target_unit(action: CompiledAction, rule_kind: str) -> str:
    """What an action's fleet share counts: `node` for an action whose class declares `unit = "node"`
    (cordon/uncordon act on the entity's node), else entities of the rule's kind."""
    return "node" if action.unit == "node" else rule_kind


class Limiter:
    """Counts action runs in a rolling hour and firing entities, and decides `held` / `suppressed`.

    Counting is the core's business (it sees every transition); the action runner never has to ask.
    """

    def __init__(self, engine_limits: Mapping[str, LimitConfig] | None = None) -> None:
        self.engine_limits = dict(engine_limits or {})
        self._rule_runs: dict[str, deque[float]] = {}
        self._type_runs: dict[str, deque[float]] = {}
        self._firing_rule: dict[str, set[str]] = {}
        self._firing_type: dict[tuple[str, str], dict[str, int]] = {}  # (type, unit) -> target key -> incidents

    def reset_firing(self) -> None:
        self._firing_rule.clear()
        self._firing_type.clear()

    def set_firing(self, rule: Rule, entity_key: str, firing: bool, node_key: str = "") -> None:
        """Keep the share of firing entities: call on every change into or out of `firing`. For each action type
        of the rule's `actions`, the target counted is the entity, or its node (`node_key`) for cordon/uncordon."""
        keys = self._firing_rule.setdefault(rule.name, set())
        if firing == (entity_key in keys):
            return
        if firing:
            keys.add(entity_key)
        else:
            keys.discard(entity_key)
        for a in {a.type: a for a in rule.actions}.values():
            unit = target_unit(a, rule.kind)
            target = (node_key or entity_key) if unit == "node" else entity_key
            counts = self._firing_type.setdefault((a.type, unit), {})
            n = counts.get(target, 0) + (1 if firing else -1)
            if n > 0:
                counts[target] = n
            else:
                counts.pop(target, None)

    def firing_count(self, rule: str) -> int:
        return len(self._firing_rule.get(rule, ()))

    @staticmethod
    def _recent(runs: deque[float] | None, now_ts: float) -> int:
        if runs is None:
            return 0
        while runs and runs[0] <= now_ts - HOUR_S:
            runs.popleft()
        return len(runs)

    def decide(
        self, rule: Rule, action: CompiledAction, totals: Mapping[str, int], now_ts: float,
    ) -> tuple[Decision, str | None]:
        """`held` (too much of the fleet firing, destructive only), `suppressed` (rate), else `run`.

        `totals`: the entities known of each kind (`node`, `gpu`, `process`). A rule's `max_fleet_pct` is its
        firing entities out of those of its kind; `engine.limits.<type>.max_fleet_pct` is the targets of that
        action type affected by any firing rule, out of all targets of that unit (nodes for cordon/uncordon)."""
        if action.destructive:
            pct = rule.spec.limits.max_fleet_pct
            total = totals.get(rule.kind, 0)
            if pct is not None and total > 0:
                n = self.firing_count(rule.name)
                share = 100.0 * n / total
                if share > pct:
                    return "held", (f"{n} of {total} {rule.kind} entities ({share:.1f}%) are firing {rule.name}, "
                                    f"over max_fleet_pct {pct:g}%")
            fleet = self.engine_limits.get(action.type)
            unit = target_unit(action, rule.kind)
            total = totals.get(unit, 0)
            if fleet is not None and fleet.max_fleet_pct is not None and total > 0:
                n = len(self._firing_type.get((action.type, unit), {}))
                share = 100.0 * n / total
                if share > fleet.max_fleet_pct:
                    return "held", (f"{n} of {total} {unit}s ({share:.1f}%) are targets of firing rules with "
                                    f"{action.type}, over engine.limits.{action.type}.max_fleet_pct "
                                    f"{fleet.max_fleet_pct:g}%")
        per_rule = rule.spec.limits.max_per_hour
        if per_rule is not None and self._recent(self._rule_runs.get(rule.name), now_ts) >= per_rule:
            return "suppressed", f"rule {rule.name} ran {per_rule} actions in the last hour (max_per_hour)"
        fleet = self.engine_limits.get(action.type)
        if fleet is not None and fleet.max_per_hour is not None and (
            self._recent(self._type_runs.get(action.type), now_ts) >= fleet.max_per_hour
        ):
            return "suppressed", (f"{fleet.max_per_hour} {action.type} actions ran in the last hour "
                                  f"(engine.limits.{action.type}.max_per_hour)")
        return "run", None

    def record(self, rule: Rule, action: CompiledAction, now_ts: float) -> None:
        """Count one run against the rule's and the action type's hourly budgets."""
        self._rule_runs.setdefault(rule.name, deque()).append(now_ts)
        self._type_runs.setdefault(action.type, deque()).append(now_ts)
