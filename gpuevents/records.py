"""What crosses between engine, action runners and audit: action requests and audit records."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuevents import subjects as S
from gpuevents.events import new_id
from gpuevents.facts import Facts

EntityKind = Literal["node", "gpu", "process", "job"]
ActionUnit = Literal["entity", "node"]
"""What an action's fleet share counts: the rule's entities, or their nodes (cordon acts on the node)."""
Phase = Literal["fire", "repeat", "stage", "resolve"]
Outcome = Literal["ok", "failed", "suppressed", "held", "dry_run", "refused", "expired"]
Decision = Literal["run", "suppressed", "held", "refused", "dry_run"]
IncidentStatus = Literal["inactive", "pending", "firing", "resolved"]


class ActionRequest(BaseModel):
    """One action to run for one incident, already rendered; published to `gpuevents.act.<type>`.

    `key` is the idempotency key (incident id, phase, action index, repeat count): a key that ran
    once never runs again, whoever delivers it and however often.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    key: str
    type: str
    params: dict[str, Any]
    rule: str
    rule_labels: dict[str, str] = Field(default_factory=dict)
    entity_id: str
    entity_kind: EntityKind
    entity_key: str | None = Field(None, description="the engine's key of the entity (a process's adds its start, "
                                   "a Kubernetes job's its owner's uid): where its incident is kept")
    cluster: str = "default"
    node: str | None = None
    incident_id: str
    phase: Phase = "fire"
    index: int = 0
    repeat: int = 0
    destructive: bool = False
    dry_run: bool = False
    decision: Decision = "run"
    reason: str | None = None
    facts: Facts = Field(default_factory=Facts, description="what the engine knows of the entity (gpuevents/facts.py)")
    created_at: datetime
    event_time: datetime | None = Field(None, description="when the triggering event was observed")
    approve: str | None = Field(None, description="the Slack channel that must approve it first (DESIGN §3.4)")
    approve_within: float = Field(3600.0, description="seconds to wait for the approval; then `expired`")
    approval_key: str | None = Field(None, description="requests with the same key share one approval: those a "
                                     "fleet-share limit holds in one outbreak (`hold:<rule>:<since>`)")


class ActionMessage(NamedTuple):
    """An action request as a JetStream message: subject, JSON payload, `Nats-Msg-Id`."""

    subject: str
    payload: bytes
    msg_id: str


_action_subject = functools.lru_cache(maxsize=256)(S.action_subject)


def action_message(request: ActionRequest) -> ActionMessage:
    """How a request goes to the runners: `gpuevents.act.<type>`, its JSON, and its `key` as the message id,
    so a request published again (a commit retried after a restart) is stored once."""
    return ActionMessage(_action_subject(request.type), request.model_dump_json().encode(), request.key)


class AuditRecord(BaseModel):
    """One line of `gpuevents audit`: an incident transition or an action outcome."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str = Field(default_factory=new_id)
    time: datetime
    kind: Literal["transition", "action", "snooze", "reload", "click", "request"]
    rule: str = ""
    entity_id: str = ""
    cluster: str = "default"
    incident_id: str | None = None
    from_status: IncidentStatus | None = None
    to_status: IncidentStatus | None = None
    action_type: str | None = None
    action_key: str | None = None
    outcome: Outcome | None = None
    attempt: int = 0
    error: str | None = None
    detail: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    dry_run: bool = False
    slot_freed: bool = Field(False, description="a runner's refusal for protection, an exemption or a contradicted "
                             "claim of a request the engine had counted: the engine gives its max_per_hour slot back")
    facts: Facts = Field(default_factory=Facts, description="an action's: the facts its decision used "
                         "(the entity as the engine saw it: `gpuevents audit --facts`, `--json`)")


def unique_records(records: Iterable[AuditRecord]) -> list[AuditRecord]:
    """`records` with each id once (the first): a transition recorded again after a crash between its audit
    and its incident write has the same id (`transition_id`), and is one transition."""
    seen: set[str] = set()
    out = []
    for r in records:
        if r.id not in seen:
            seen.add(r.id)
            out.append(r)
    return out


def transition_id(incident_id: str, from_status: str, to_status: str) -> str:
    """The id of an incident's transition: each (from, to) happens at most once in an incident's life."""
    return f"{incident_id}:{from_status}>{to_status}"


AUDIT_MESSAGE_BYTES = 64 * 1024
"""An audit message holds one record or more (JSON lines) up to about this size: the engine writes a batch's
transitions of one rule as one message, not one message each."""


class AuditMessage(BaseModel):
    """One message for GPUEVENTS_AUDIT: records of one rule as JSON lines, with a message id for dedup."""

    model_config = ConfigDict(frozen=True)

    subject: str
    payload: bytes
    msg_id: str
    count: int


def audit_messages(records: Iterable[AuditRecord], max_bytes: int = AUDIT_MESSAGE_BYTES) -> list[AuditMessage]:
    """Group records by rule (their subject is `gpuevents.audit.<rule>`) into messages of up to `max_bytes`;
    records keep their order within a rule. A message's id is its first record's id and its count, so the
    same records sent again are stored once."""
    lines: dict[str, list[bytes]] = {}
    firsts: dict[str, str] = {}
    sizes: dict[str, int] = {}
    out: list[AuditMessage] = []

    def close(rule: str) -> None:
        batch = lines.pop(rule)
        out.append(AuditMessage(subject=S.audit_subject(rule), payload=b"\n".join(batch),
                                msg_id=f"{firsts.pop(rule)}+{len(batch)}", count=len(batch)))
        sizes.pop(rule)

    for r in records:
        rule = r.rule or "engine"
        line = r.model_dump_json().encode()
        if rule in lines and sizes[rule] + len(line) + 1 > max_bytes:
            close(rule)
        if rule not in lines:
            lines[rule], firsts[rule], sizes[rule] = [], r.id, 0
        lines[rule].append(line)
        sizes[rule] += len(line) + 1
    for rule in list(lines):
        close(rule)
    return out


def decode_audit(payload: bytes) -> list[AuditRecord]:
    """The records of one audit message (one JSON object per line); lines that are not a record are left out."""
    out = []
    for line in payload.split(b"\n"):
        if not line.strip():
            continue
        try:
            out.append(AuditRecord.model_validate_json(line))
        except ValidationError:
            continue
    return out

