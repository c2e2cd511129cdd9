"""What crosses between engine, action runners and audit: action requests and audit records."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuevents.events import new_id

EntityKind = Literal["node", "gpu", "process"]
Phase = Literal["fire", "repeat", "resolve"]
Outcome = Literal["ok", "failed", "suppressed", "held", "dry_run", "refused"]
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
    facts: dict[str, Any] = Field(default_factory=dict, description="entity facts for messages")
    created_at: datetime
    event_time: datetime | None = Field(None, description="when the triggering event was observed")


class AuditRecord(BaseModel):
    """One line of `gpuevents audit`: an incident transition or an action outcome."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str = Field(default_factory=new_id)
    time: datetime
    kind: Literal["transition", "action", "snooze", "reload"]
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
