"""Limits and safety (DESIGN §3.4): rolling-hour rates, fleet-share holds, per rule and per action type.

The rolling-hour windows are counted here and nowhere else (the runners do not count again), and they are
persisted with the incidents (`LimitWindows`), so a restart or a new lease holder continues them. The fleet
share counts the entities that match a rule (pending or firing), in the unit the action acts on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from pydantic import BaseModel

from gpuevents.config import LimitConfig
from gpuevents.records import Decision
from rules.lang.model import CompiledAction, Rule

HOUR_S = 3600.0


class LimitWindows(BaseModel):
    """The run times (epoch seconds) of the last hour, per rule and per action type: what a restart resumes."""

    rules: dict[str, list[float]] = {}
    types: dict[str, list[float]] = {}


class ShareCounts(BaseModel):
    """A partition's part of the fleet shares: entities matching each rule (in entities and in nodes), targets
    of each action type (`type/unit`), and the entities it knows of each kind."""

    matching: dict[str, dict[str, int]] = {}
    by_type: dict[str, int] = {}
    totals: dict[str, int] = {}
    at: float = 0.0  # epoch seconds when it was counted: an old report (a partition gone) is not counted


class Elsewhere(BaseModel):
    """What the other partitions of the fleet last reported: fleet-wide limits count them too."""

    windows: list[LimitWindows] = []
    shares: list[ShareCounts] = []


def target_unit(action: CompiledAction, rule_kind: str) -> str:
    """What an action's fleet share counts: `node` for an action whose class declares `unit = "node"`
    (cordon/uncordon act on the entity's node), else entities of the rule's kind."""
    return "node" if action.unit == "node" else rule_kind


class Limiter:
    """Counts action runs in a rolling hour and matching entities, and decides `held` / `suppressed`."""

    def __init__(self, engine_limits: Mapping[str, LimitConfig] | None = None) -> None:
        self.engine_limits = dict(engine_limits or {})
        self._rule_runs: dict[str, deque[float]] = {}
        self._type_runs: dict[str, deque[float]] = {}
        self._matching: dict[str, dict[str, str]] = {}  # rule -> matching entity key -> its node key
        self._by_type: dict[tuple[str, str], dict[str, int]] = {}  # (type, unit) -> target key -> matching count
        self.dirty = False  # the windows changed since `windows()` was last taken
        self.elsewhere = Elsewhere()  # the other partitions' counts, set by the engine (none unpartitioned)
        self.outbreaks: dict[str, float] = {}  # rule -> when its fleet-share hold began (epoch s), while it holds

    # ------------------------------------------------------------ the rolling-hour windows
    def windows(self, now_ts: float) -> LimitWindows:
        """The windows as they stand (older runs dropped), to persist; clears `dirty`."""
        self.dirty = False
        # The runs are in time order: drop the old ones from the left, copy the rest at C speed; they are this
        # limiter's own floats, so the copy is not validated again (a big fleet's start records thousands).
        return LimitWindows.model_construct(
            rules={k: list(v) for k, v in self._rule_runs.items() if self._recent(v, now_ts)},
            types={k: list(v) for k, v in self._type_runs.items() if self._recent(v, now_ts)})

    def restore_windows(self, w: LimitWindows) -> None:
        """Continue the windows a previous engine persisted (a restart must not reset a rate limit)."""
        for name, runs in w.rules.items():
            self._rule_runs[name] = deque(sorted([*runs, *self._rule_runs.get(name, ())]))
        for type_, runs in w.types.items():
            self._type_runs[type_] = deque(sorted([*runs, *self._type_runs.get(type_, ())]))

    @staticmethod
    def _recent(runs: deque[float] | None, now_ts: float) -> int:
        if runs is None:
            return 0
        while runs and runs[0] <= now_ts - HOUR_S:
            runs.popleft()
        return len(runs)

    def _recent_elsewhere(self, now_ts: float, rule: str | None = None, type_: str | None = None) -> int:
        cut = now_ts - HOUR_S
        n = 0
        for w in self.elsewhere.windows:
            runs = w.rules.get(rule, ()) if rule is not None else w.types.get(type_ or "", ())
            n += sum(1 for t in runs if t > cut)
        return n

    def share_counts(self, totals: Mapping[str, int]) -> ShareCounts:
        """This partition's part of the fleet shares, for the others to count."""
        return ShareCounts(
            matching={r: {"entity": len(k), "node": len(set(k.values()))} for r, k in self._matching.items() if k},
            by_type={f"{t}/{u}": len(c) for (t, u), c in self._by_type.items() if c},
            totals=dict(totals),
        )

    def record(self, rule: Rule, action: CompiledAction, now_ts: float) -> None:
        """Count one run against the rule's and the action type's hourly budgets."""
        self._rule_runs.setdefault(rule.name, deque()).append(now_ts)
        self._type_runs.setdefault(action.type, deque()).append(now_ts)
        self.dirty = True

    def give_back(self, rule: str, type_: str, now_ts: float) -> None:
        """Uncount the latest run of the rule and of the action type (up to `now_ts`): a runner refused it for
        protection, an exemption or a contradicted claim, so it takes no max_per_hour slot (DESIGN §3.4)."""
        for runs in (self._rule_runs.get(rule), self._type_runs.get(type_)):
            if runs:
                latest = max((t for t in runs if t <= now_ts), default=None)
                if latest is not None:
                    runs.remove(latest)
                    self.dirty = True

    def decide_type(self, type_: str, now_ts: float) -> tuple[Decision, str | None]:
        """A request no rule made (a person's kill): `suppressed` past engine.limits.<type>.max_per_hour."""
        fleet = self.engine_limits.get(type_)
        if fleet is not None and fleet.max_per_hour is not None and (
            self._recent(self._type_runs.get(type_), now_ts)
            + (self._recent_elsewhere(now_ts, type_=type_) if self.elsewhere.windows else 0) >= fleet.max_per_hour
        ):
            return "suppressed", (f"{fleet.max_per_hour} {type_} actions ran in the last hour "
                                  f"(engine.limits.{type_}.max_per_hour)")
        return "run", None

    def record_type(self, type_: str, now_ts: float) -> None:
        """Count one run against the action type's hourly budget (a person's action has no rule)."""
        self._type_runs.setdefault(type_, deque()).append(now_ts)
        self.dirty = True

    # ------------------------------------------------------------ the fleet share
    def reset_matching(self) -> None:
        self._matching.clear()
        self._by_type.clear()

    def set_matching(self, rule: Rule, entity_key: str, matching: bool, node_key: str) -> None:
        """Keep the share of matching entities (pending or firing): call on every change into or out of an open
        incident. For each action type of the rule, the target counted is the entity, or its node."""
        keys = self._matching.setdefault(rule.name, {})
        if matching == (entity_key in keys):
            return
        if matching:
            keys[entity_key] = node_key or entity_key
        else:
            del keys[entity_key]
            if not keys:
                self.outbreaks.pop(rule.name, None)  # nothing matches: the outbreak is over
        for a in {a.type: a for a in (*rule.actions, *rule.on_resolve)}.values():
            unit = target_unit(a, rule.kind)
            target = (node_key or entity_key) if unit == "node" else entity_key
            counts = self._by_type.setdefault((a.type, unit), {})
            n = counts.get(target, 0) + (1 if matching else -1)
            if n > 0:
                counts[target] = n
            else:
                counts.pop(target, None)

    def matching_count(self, rule: str, unit: str = "entity") -> int:
        """Entities matching `rule`, or the distinct nodes they are on (`unit="node"`)."""
        keys = self._matching.get(rule, {})
        return len(set(keys.values())) if unit == "node" else len(keys)

    # ------------------------------------------------------------ deciding
    def decide(
        self, rule: Rule, action: CompiledAction, totals: Mapping[str, int], now_ts: float,
    ) -> tuple[Decision, str | None]:
        """`held` (too much of the fleet matching, destructive only), `suppressed` (rate), else `run`."""
        held = self.hold(rule, action, totals, now_ts)
        if held is not None:
            return "held", held
        return self.decide_rate(rule, action, now_ts)

    def outbreak(self, rule: str) -> float | None:
        """When the rule's current fleet-share hold began (epoch seconds), or None while it holds nothing."""
        return self.outbreaks.get(rule)

    def hold(self, rule: Rule, action: CompiledAction, totals: Mapping[str, int], now_ts: float) -> str | None:
        """Why the fleet-share limits hold this destructive action, or None; a hold starts the rule's outbreak.

        `totals`: the entities known of each kind (`node`, `gpu`, `process`). A rule's `max_fleet_pct` is its
        matching entities, in the action's unit, out of all of that unit; `engine.limits.<type>.max_fleet_pct`
        is the targets of that action type matched by any rule, out of all targets of that unit. Neither holds
        while at most its `fleet_floor` match."""
        if not action.destructive:
            return None
        why = self._share_hold(rule, action, totals)
        if why is None:
            self.outbreaks.pop(rule.name, None)
        else:
            self.outbreaks.setdefault(rule.name, now_ts)
        return why

    def _share_hold(self, rule: Rule, action: CompiledAction, totals: Mapping[str, int]) -> str | None:
        if action.destructive:
            unit = target_unit(action, rule.kind)
            shares = self.elsewhere.shares
            total = totals.get(unit, 0) + sum(s.totals.get(unit, 0) for s in shares)
            pct = rule.spec.limits.max_fleet_pct
            in_unit = "node" if unit == "node" else "entity"
            if pct is not None and total > 0:
                n = self.matching_count(rule.name, in_unit) + sum(
                    s.matching.get(rule.name, {}).get(in_unit, 0) for s in shares)
                share = 100.0 * n / total
                if share > pct and n > rule.spec.limits.fleet_floor:
                    return (f"{n} of {total} {_plural(unit)} ({share:.1f}%) match {rule.name}, "
                            f"over max_fleet_pct {pct:g}%")
            fleet = self.engine_limits.get(action.type)
            if fleet is not None and fleet.max_fleet_pct is not None and total > 0:
                n = len(self._by_type.get((action.type, unit), {})) + sum(
                    s.by_type.get(f"{action.type}/{unit}", 0) for s in shares)
                share = 100.0 * n / total
                if share > fleet.max_fleet_pct and n > fleet.fleet_floor:
                    return (f"{n} of {total} {_plural(unit)} ({share:.1f}%) are targets of matching rules with "
                            f"{action.type}, over engine.limits.{action.type}.max_fleet_pct "
                            f"{fleet.max_fleet_pct:g}%")
        return None

    def decide_rate(self, rule: Rule, action: CompiledAction, now_ts: float) -> tuple[Decision, str | None]:
        """`suppressed` past the rule's or the action type's max_per_hour, else `run`."""
        per_rule = rule.spec.limits.max_per_hour
        if per_rule is not None and self._recent(self._rule_runs.get(rule.name), now_ts) + (
            self._recent_elsewhere(now_ts, rule=rule.name) if self.elsewhere.windows else 0
        ) >= per_rule:
            return "suppressed", f"rule {rule.name} ran {per_rule} actions in the last hour (max_per_hour)"
        fleet = self.engine_limits.get(action.type)
        if fleet is not None and fleet.max_per_hour is not None and (
            self._recent(self._type_runs.get(action.type), now_ts)
            + (self._recent_elsewhere(now_ts, type_=action.type) if self.elsewhere.windows else 0)
            >= fleet.max_per_hour
        ):
            return "suppressed", (f"{fleet.max_per_hour} {action.type} actions ran in the last hour "
                                  f"(engine.limits.{action.type}.max_per_hour)")
        return "run", None


def _plural(unit: str) -> str:
    return unit + ("es" if unit.endswith("s") else "s")
