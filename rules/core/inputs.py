"""What goes into the core besides events (ticks, snoozes, forgotten nodes) and what one step gives back."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from gpuevents.events import Event
from gpuevents.records import ActionRequest, AuditRecord, Outcome, Phase
from rules.core.incidents import Incident, Transition
from rules.core.limits import LimitWindows
from rules.core.state import Entity
from rules.lang.model import Rule


class Tick(BaseModel):
    """Time passed: evaluate what depends on time. Send one at every `next_wakeup`.

    `sweep=False`: the periodic re-evaluation of time-dependent rules over every entity is not done here but
    named in `StepResult.sweeps`, for the caller to run as `Sweep` steps a slice at a time (the engine does,
    so that a big fleet's sweep never holds events back for long)."""

    model_config = ConfigDict(frozen=True)
    type: Literal["tick"] = "tick"
    sweep: bool = True


class Sweep(BaseModel):
    """Evaluate one rule for these entities (keys) now: a slice of a tick's sweep (see `Tick.sweep`). With
    `rule_hash`, a rule that has changed since (a reload between slices) is left to its own next sweep."""

    model_config = ConfigDict(frozen=True)
    type: Literal["sweep"] = "sweep"
    rule: str
    keys: tuple[str, ...]
    rule_hash: str = ""


class Snooze(BaseModel):
    """Exempt one entity from one rule until `until` (an `until` in the past lifts it)."""

    model_config = ConfigDict(frozen=True)
    type: Literal["snooze"] = "snooze"
    rule: str
    entity_id: str
    until: datetime
    by: str = ""
    reason: str = ""
    bounded: bool = False
    """A keep (the owner's button, `gpuevents keep`): at most the rule's `snooze_max` (longer only once approved,
    as a snooze: gpuevents/wire/keeps.py)."""
    entity_key: str = ""
    """The snoozed entity's internal key when it was known (a process's includes its create time): a process
    that reuses the pid is another entity and is not exempt."""


class ForgetNode(BaseModel):
    """A node is gone for good (decommissioned; `gone: true` in a rule test): its incidents resolve as gone."""

    model_config = ConfigDict(frozen=True)
    type: Literal["forget_node"] = "forget_node"
    node: str
    cluster: str = "default"


WARNING_TYPES = frozenset({"slack", "email", "notify"})
"""Actions that tell a person: what a staged destructive action waits to have been delivered."""

class ActionOutcome(BaseModel):
    """A runner's final outcome of an action request (from the audit stream), fed back to the core."""

    model_config = ConfigDict(frozen=True)
    type: Literal["action_outcome"] = "action_outcome"
    rule: str
    incident_id: str
    key: str
    """The request's idempotency key (`<incident>:<phase>:<index>:<repeat>`)."""
    outcome: Outcome
    action_type: str = ""
    slot_freed: bool = False
    """A runner refused it for protection, an exemption or a contradicted claim: its max_per_hour slot comes back."""

    @classmethod
    def of(cls, record: AuditRecord) -> ActionOutcome | None:
        """The outcome an audit record reports of a warning or of a refusal that frees a slot, else None."""
        if (record.kind != "action" or (record.action_type not in WARNING_TYPES and not record.slot_freed)
                or not record.incident_id or not record.action_key or record.outcome is None):
            return None
        return cls(rule=record.rule, incident_id=record.incident_id, key=record.action_key, outcome=record.outcome,
                   action_type=record.action_type or "", slot_freed=record.slot_freed)


class EvalProblem(BaseModel):
    """A condition that raised; reported once per rule and message, counted every time."""

    model_config = ConfigDict(frozen=True)
    rule: str
    entity_id: str
    message: str


CoreInput = Event | Tick | Sweep | Snooze | ForgetNode | ActionOutcome


@dataclass(frozen=True, slots=True)
class PendingSend:
    """An incident whose send phase came due during a step: its requests are rendered and decided at its end."""

    rule: Rule
    entity: Entity
    incident: Incident
    phase: Phase
    event_time: datetime | None


@dataclass
class StepResult:
    """What one step did: transitions (audit), action requests, the incidents that changed (persist them)."""

    transitions: list[Transition] = field(default_factory=list)
    actions: list[ActionRequest] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)
    errors: list[EvalProblem] = field(default_factory=list)
    snoozes: list[Snooze] = field(default_factory=list)
    sweeps: list[str] = field(default_factory=list)  # rules a `Tick(sweep=False)` left to `Sweep` steps
    limits: LimitWindows | None = None  # the rate-limit windows, when this step changed them (persist them)

    def extend(self, other: StepResult) -> None:
        self.transitions += other.transitions
        self.actions += other.actions
        self.incidents += other.incidents
        self.errors += other.errors
        self.snoozes += other.snoozes
        self.sweeps += other.sweeps
        if other.limits is not None:
            self.limits = other.limits


class BatchResult(NamedTuple):
    """What a batch of steps did (`Core.step_batch`): the results added up, and the inputs left out (by their
    position in the batch) with the error that stopped each."""

    result: StepResult
    failed: list[tuple[int, Exception]]
