"""The rule set as the core uses it: by name, and grouped by what makes each rule run (events, the clock, liveness)."""

from __future__ import annotations

from collections.abc import Iterator

from rules.lang.model import Rule, RuleSet

KINDS = ("node", "gpu", "process", "job")


class RulePlan:
    """The current rules, grouped once per rule set; the core replaces them on a reload, the others read them."""

    __slots__ = ("by_name", "event_rules", "has_time_rules", "liveness_rules", "rules", "time_rules", "timed")

    def __init__(self, rules: RuleSet | None = None) -> None:
        self.rules = RuleSet()
        self.by_name: dict[str, Rule] = {}
        self.event_rules: dict[str, list[Rule]] = {}  # kind -> rules evaluated on events (not scheduled)
        self.time_rules: dict[str, list[Rule]] = {}  # kind -> those of event_rules whose condition reads the clock
        self.has_time_rules = False
        self.liveness_rules: list[Rule] = []
        self.timed: list[Rule] = []  # event rules with a `for`, a repeat or stages: their incidents have deadlines
        self.set(rules or RuleSet())

    def set(self, rules: RuleSet) -> None:
        self.rules = rules
        self.by_name = dict(rules.by_name)
        self.event_rules = {k: [r for r in rules if r.kind == k and not r.scheduled] for k in KINDS}
        self.time_rules = {k: [r for r in v if r.condition.time_dependent] for k, v in self.event_rules.items()}
        self.has_time_rules = any(self.time_rules.values())
        self.liveness_rules = [r for r in rules if r.reads_liveness and not r.scheduled]
        self.timed = [r for r in rules if not r.scheduled and (r.for_s > 0 or r.repeat_s is not None or r.stages)]

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)
