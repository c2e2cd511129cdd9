"""Rules as users write them (pydantic, DESIGN §3) and as the core runs them (compiled, frozen)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from typing import Any, Literal

from apscheduler.triggers.cron import CronTrigger
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuevents.durations import Duration
from gpuevents.records import ActionUnit
from rules.lang.expr import Condition
from rules.lang.templates import ParamTree

EntityKind = Literal["node", "gpu", "process", "job"]
NAME_PATTERN = r"^[a-z0-9][a-z0-9-]*$"


class RuleLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max_per_hour: int | None = Field(None, ge=0)
    max_fleet_pct: float | None = Field(None, ge=0, le=100)
    fleet_floor: int = Field(0, ge=0, description="max_fleet_pct holds only when more than this many match (in "
                             "the action's unit): a small fleet can reclaim its few")


class ActionSpec(BaseModel):
    """One action as written: `type` plus its parameters (checked by the action's own model)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str
    after: Duration | None = Field(None, description="a staged action: run this long after the incident fired, "
                                   "if it is still firing and not snoozed (DESIGN §3.3)")
    approve: str | None = Field(None, description="a destructive action runs only once a member of this Slack "
                                "channel (or actions.slack.admins) approves it")
    approve_within: Duration = Field(3600, description="unanswered this long, the approval ends `expired`")
    require_warning: bool = Field(True, description="a staged destructive action runs only if a warning its "
                                  "incident sent before was delivered (DESIGN §5); false: run regardless")

    @field_validator("after")
    @classmethod
    def _after_positive(cls, v: float | None) -> float | None:
        if v is not None and v <= 0:
            raise ValueError("must be more than 0s (leave `after` out to act when the rule fires)")
        return v

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class RuleSpec(BaseModel):
    """One rule as written in YAML."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    entity: EntityKind
    when: str
    for_: Duration | None = Field(None, alias="for")
    repeat: Duration | None = None
    snooze_max: Duration = Field(86400, description="the longest an owner may keep an entity (Slack's keep button, "
                                 "`gpuevents keep`)")
    schedule: str | list[str] | None = None
    timezone: str | None = None
    dry_run: bool = False
    labels: dict[str, str] = Field(default_factory=dict)
    limits: RuleLimits = RuleLimits(max_per_hour=None, max_fleet_pct=None)
    actions: list[ActionSpec] = Field(min_length=1)
    on_resolve: list[ActionSpec] = Field(default_factory=list)

    @field_validator("repeat")
    @classmethod
    def _positive(cls, v: float | None) -> float | None:
        if v is not None and v <= 0:
            raise ValueError("must be longer than 0s")
        return v

    @field_validator("when", mode="before")
    @classmethod
    def _literal_when(cls, v: Any) -> Any:
        if isinstance(v, bool):  # `when: true` is read by YAML as a boolean; mean the same expression
            return "true" if v else "false"
        return v

    @field_validator("labels", mode="before")
    @classmethod
    def _label_strings(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {str(k): str(x) if isinstance(x, int | float | bool) else x for k, x in v.items()}
        return v

    def schedules(self) -> list[str]:
        if self.schedule is None:
            return []
        return [self.schedule] if isinstance(self.schedule, str) else list(self.schedule)


class RuleFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rules: list[dict[str, Any]]


_DOW_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_DOW_FULL = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")
_DOW_ITEM = re.compile(r"^(\*|[0-9a-z]+)(?:-([0-9a-z]+))?(?:/(\d+))?$")


def _weekday(token: str) -> int:
    """A crontab weekday: 0-7 (0 and 7 are Sunday) or a name (`MON`, `sunday`)."""
    if token.isdigit():
        n = int(token)
        if n > 7:
            raise ValueError(f"weekday {token} is not 0-7")
        return n % 7
    for i, name in enumerate(_DOW_NAMES):
        if token == name or token == _DOW_FULL[i]:
            return i
    raise ValueError(f"unknown weekday {token!r}; use 0-7 (0 and 7 are Sunday) or MON-SUN")


def crontab_weekdays(field: str) -> list[int]:
    """The weekdays (0 = Sunday) a crontab(5) day-of-week field names: lists, ranges and steps counted as cron
    counts them (`1-5/2` is Monday, Wednesday and Friday; `*/2` is Sunday, Tuesday, Thursday, Saturday)."""
    days: set[int] = set()
    for item in field.lower().split(","):
        m = _DOW_ITEM.match(item)
        if m is None:
            raise ValueError(f"weekday field item {item!r} is not a day, a range or a step")
        start, end, step = m.group(1), m.group(2), int(m.group(3) or 1)
        if step < 1:
            raise ValueError(f"step {step} in {item!r} must be at least 1")
        if start == "*":
            if end is not None:
                raise ValueError(f"{item!r}: * cannot start a range")
            lo, hi = 0, 6
        else:
            lo = _weekday(start)
            hi = (7 if end.isdigit() and int(end) == 7 else _weekday(end)) if end is not None else (
                6 if m.group(3) else lo)
            if hi < lo:
                raise ValueError(f"range {item!r} runs backwards")
        days.update(d % 7 for d in range(lo, hi + 1, step))
    return sorted(days)


def cron_triggers(expr: str, tz: tzinfo) -> tuple[CronTrigger, ...]:
    """APScheduler triggers for a 5-field crontab line, read as crontab(5) does: weekdays 0 and 7 are Sunday,
    and when both day of month and day of week are restricted, a day matching either one fires."""
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"{expr!r}: a cron line has 5 fields (minute hour day month weekday)")
    minute, hour, dom, month, dow = fields
    try:
        names = "*" if dow.startswith("*") and "/" not in dow else ",".join(
            _DOW_NAMES[d] for d in crontab_weekdays(dow))

        def trigger(day: str, day_of_week: str) -> CronTrigger:
            return CronTrigger(minute=minute, hour=hour, day=day, month=month, day_of_week=day_of_week, timezone=tz)

        if not dom.startswith("*") and not dow.startswith("*"):
            return (trigger(dom, "*"), trigger("*", names))
        return (trigger(dom, names),)
    except ValueError as e:
        raise ValueError(f"{expr!r}: {e}") from None


@dataclass(frozen=True)
class CompiledAction:
    """An action of a rule, ready to render: its templates compiled with the destination's escaping.

    `destructive` and `unit` (what its fleet share counts: the rule's entities or their nodes) are what
    the action's class declares."""

    type: str
    index: int
    params: dict[str, ParamTree]
    destructive: bool
    line: int = 0
    unit: ActionUnit = "entity"
    after_s: float | None = None
    """A staged action: how long after the incident fired it runs (None: at firing and each repeat)."""
    approve: str | None = None
    approve_within_s: float = 3600.0
    require_warning: bool = True
    """A staged destructive action: run only if a warning of its incident was delivered
    (rules/core/warning_ledger.py)."""


@dataclass(frozen=True, eq=False)
class Rule:
    """A loaded rule: the spec plus everything compiled from it. `hash` changes when anything that
    affects its behaviour does, so a reload keeps the incidents of unchanged rules."""

    spec: RuleSpec
    condition: Condition
    tz: tzinfo
    tz_name: str
    triggers: tuple[CronTrigger, ...]
    actions: tuple[CompiledAction, ...]
    on_resolve: tuple[CompiledAction, ...]
    hash: str
    file: str = ""
    line: int = 0
    legacy_hash: str = ""
    """The hash as engines before the narrower `rule_hash` computed it, so their incidents restore unchanged."""
    reads_liveness: bool = False
    """A node rule whose condition reads `node.online` or `node.last_seen`: evaluated on offline nodes too."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> EntityKind:
        return self.spec.entity

    @property
    def for_s(self) -> float:
        return self.spec.for_ or 0.0

    @property
    def repeat_s(self) -> float | None:
        return self.spec.repeat

    @property
    def snooze_max_s(self) -> float:
        return float(self.spec.snooze_max)

    @property
    def scheduled(self) -> bool:
        return bool(self.triggers)

    @property
    def stages(self) -> tuple[float, ...]:
        """The distinct `after` offsets of the staged actions, in order: stage i runs at fired_at + stages[i]."""
        return tuple(sorted({a.after_s for a in self.actions if a.after_s is not None}))

    def stage_actions(self, stage: int) -> tuple[CompiledAction, ...]:
        offsets = self.stages
        if not 0 <= stage < len(offsets):
            return ()
        return tuple(a for a in self.actions if a.after_s == offsets[stage])

    def last_cron(self, at: datetime) -> datetime | None:
        """The latest cron instant at or before `at` (looked for up to 8 days back)."""
        best: datetime | None = None
        for t in self.triggers:
            for back in (120, 3600, 86400, 8 * 86400):  # a short window first: a `* * * * *` has many instants
                prev: datetime | None = None
                nxt = t.get_next_fire_time(None, at - timedelta(seconds=back))
                while nxt is not None and nxt <= at:
                    prev = nxt
                    nxt = t.get_next_fire_time(nxt, nxt + timedelta(seconds=1))
                if prev is not None:
                    if best is None or prev > best:
                        best = prev
                    break
        return best

    def next_cron(self, after: datetime) -> datetime | None:
        """The first cron instant strictly after `after`."""
        best: datetime | None = None
        for t in self.triggers:
            nxt = t.get_next_fire_time(None, after)
            if nxt is not None and nxt <= after:
                nxt = t.get_next_fire_time(None, after + timedelta(seconds=1))
            if nxt is not None and (best is None or nxt < best):
                best = nxt
        return best


@dataclass(frozen=True)
class RuleSet:
    """A whole, valid set of rules, by name."""

    rules: tuple[Rule, ...] = ()
    files: tuple[str, ...] = ()
    by_name: dict[str, Rule] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.by_name:
            object.__setattr__(self, "by_name", {r.name: r for r in self.rules})

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    @property
    def longest_for_s(self) -> float:
        return max((r.for_s for r in self.rules), default=0.0)
