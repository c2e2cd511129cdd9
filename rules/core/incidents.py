"""Incidents (DESIGN §3.3): one frozen record of timestamps per (rule, entity), and the pure `step`.

The state change (`step`) and the sending decision (`send_phase`) are separate, as in Prometheus:
`step` says what the incident is now, `send_phase` whether its actions run at this instant.
"""

from __future__ import annotations

import hashlib
import itertools
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuevents.durations import format_duration
from gpuevents.records import EntityKind, IncidentStatus, Phase
from gpuevents.trusted import Builder, updated

ResolveReason = Literal["condition", "gone", "snoozed", "kept", "exempt", "rule_changed", "rule_removed"]
"""Why an incident closed: `condition` (it cleared), `gone` (its node went away), `snoozed` / `kept` (an operator's
snooze / the owner's keep, see `resolved_by` and `kept_until`), `exempt` (a gpuevents.io/keep-until or exclude
annotation on its Kubernetes job); `rule_changed` / `rule_removed`: a reload (or a restart) changed or removed its
rule."""


WarningStatus = Literal["sent", "delivered", "refused", "failed", "expired", "suppressed", "held"]


class SentWarning(BaseModel):
    """One warning an incident sent, and what became of it."""

    model_config = ConfigDict(frozen=True)
    type: str
    status: WarningStatus


class Incident(BaseModel):
    """The state of one (rule, entity) pair. `sends` counts action runs (the first firing is 1)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str
    rule: str
    rule_hash: str = ""
    entity_id: str
    entity_key: str
    entity_kind: EntityKind
    cluster: str = "default"
    node: str = ""
    status: IncidentStatus
    active_at: datetime
    fired_at: datetime | None = None
    resolved_at: datetime | None = None
    last_sent_at: datetime | None = None
    sends: int = 0
    staged: int = 0
    """How many of the rule's stages (staged actions, `after:`) have run; persisted, so a restart keeps them."""
    resolve_reason: ResolveReason | None = None
    resolved_by: str = ""
    """Who snoozed or kept it (a `snoozed` or `kept` resolution)."""
    kept_until: datetime | None = None
    """Until when it is snoozed or kept (a `snoozed` or `kept` resolution)."""
    last_eval_at: datetime | None = None
    """Scheduled rules: when the incident was last evaluated (a cron instant, or a catch-up after a restart)."""
    warnings: dict[str, SentWarning] = Field(default_factory=dict)
    """The warnings it sent (by request key) and what became of them: see rules/core/warning_ledger.py."""

    @property
    def open(self) -> bool:
        return self.status in ("pending", "firing")

    @property
    def repeat_count(self) -> int:
        """0 for the first firing, then 1, 2, … for each repeat."""
        return max(0, self.sends - 1)

    def active_for(self, now: datetime) -> str:
        """How long the condition has held: pending (the rule's `for`) and firing together."""
        end = self.resolved_at or now
        return format_duration(max(0.0, (end - self.active_at).total_seconds()))

    def firing_for(self, now: datetime) -> str:
        if self.fired_at is None:
            return "0s"
        end = self.resolved_at or now
        return format_duration((end - self.fired_at).total_seconds())


class Transition(BaseModel):
    """One status change, for the audit and for rule-test timelines."""

    model_config = ConfigDict(frozen=True)

    time: datetime
    rule: str
    entity_id: str
    entity_key: str
    incident_id: str
    cluster: str = "default"
    from_status: IncidentStatus
    to_status: IncidentStatus
    reason: str = ""


_new_incident = Builder(Incident)
_new_transition = Builder(Transition)


def incident_id(rule: str, entity_key: str, active_at: datetime, rule_hash: str = "") -> str:
    """Deterministic, so two replicas (or a replay) name the same incident the same way; the rule's hash is
    part of it, so an incident a changed rule opens at the instant the old one closed is another incident."""
    raw = f"{rule}|{entity_key}|{active_at.isoformat()}" + (f"|{rule_hash}" if rule_hash else "")
    return hashlib.sha1(raw.encode()).hexdigest()[:20]


def open_incident(
    rule: str, rule_hash: str, entity_id: str, entity_key: str, kind: EntityKind, cluster: str, node: str,
    now: datetime,
) -> Incident:
    # Built from the core's own, already valid values: not validated again (thousands open at a fleet's start).
    return _new_incident(
        id=incident_id(rule, entity_key, now, rule_hash), rule=rule, rule_hash=rule_hash, entity_id=entity_id,
        entity_key=entity_key, entity_kind=kind, cluster=cluster, node=node, status="pending", active_at=now,
    )


def step(
    incident: Incident, matched: bool, now: datetime, for_s: float, repeat_s: float | None,
    stages: tuple[float, ...] = (),
) -> Incident:
    """The incident after one evaluation at `now`; `incident` is pending or firing (open_incident makes one).

    pending: stays pending, goes firing once it held for `for_s`, or inactive when false.
    firing: stays firing (with `staged` moved on by one when a stage is due, else `last_sent_at`/`sends` when a
    repeat is due), or resolved when false.
    """
    if incident.status == "pending":
        if not matched:
            return updated(incident, {"status": "inactive", "resolved_at": now, "resolve_reason": "condition"})
        if (now - incident.active_at).total_seconds() >= for_s:
            return updated(incident, {"status": "firing", "fired_at": now, "last_sent_at": now, "sends": 1})
        return incident
    if incident.status == "firing":
        if not matched:
            return resolve(incident, now, "condition")
        if incident.staged < len(stages) and incident.fired_at is not None and (
            (now - incident.fired_at).total_seconds() >= stages[incident.staged]
        ):
            return updated(incident, {"staged": incident.staged + 1})
        if repeat_s is not None and incident.last_sent_at is not None and (
            (now - incident.last_sent_at).total_seconds() >= repeat_s
        ):
            return updated(incident, {"last_sent_at": now, "sends": incident.sends + 1})
        return incident
    return incident


def resolve(incident: Incident, now: datetime, reason: ResolveReason) -> Incident:
    """Close an open incident: firing → resolved, pending → inactive."""
    status: IncidentStatus = "resolved" if incident.status == "firing" else "inactive"
    return updated(incident, {"status": status, "resolved_at": now, "resolve_reason": reason})


def send_phase(before: Incident | None, after: Incident) -> Phase | None:
    """Whether the change from `before` to `after` runs actions, and which ones."""
    was = before.status if before is not None else "inactive"
    if after.status == "firing" and was != "firing":
        return "fire"
    if after.status == "firing" and before is not None and after.staged > before.staged:
        return "stage"
    if after.status == "firing" and before is not None and after.sends > before.sends:
        return "repeat"
    if after.status == "resolved" and was == "firing":
        return "resolve"
    return None


def transitions(before: Incident | None, after: Incident, reason: str = "") -> list[Transition]:
    """The status changes between two versions of an incident (inactive → pending → firing at once when `for` is 0)."""
    was: IncidentStatus = before.status if before is not None else "inactive"
    if was == after.status:
        return []
    path: list[IncidentStatus] = [was]
    if was == "inactive" and after.status == "firing":
        path.append("pending")
    path.append(after.status)
    return [
        _new_transition(
            time=after.resolved_at if after.status in ("resolved", "inactive") and after.resolved_at else (
                after.fired_at if after.status == "firing" and after.fired_at else after.active_at),
            rule=after.rule, entity_id=after.entity_id, entity_key=after.entity_key, incident_id=after.id,
            cluster=after.cluster, from_status=a, to_status=b, reason=reason,
        )
        for a, b in itertools.pairwise(path)
    ]


def next_stage_at(incident: Incident, stages: tuple[float, ...]) -> datetime | None:
    """When the incident's next staged action is due (it must be firing), or None."""
    if incident.status != "firing" or incident.fired_at is None or incident.staged >= len(stages):
        return None
    return incident.fired_at + timedelta(seconds=stages[incident.staged])


def next_deadline(incident: Incident, for_s: float, repeat_s: float | None,
                  stages: tuple[float, ...] = ()) -> datetime | None:
    """When this incident next changes on its own: pending → firing, the next stage, or the next repeat."""
    if incident.status == "pending" and for_s > 0:
        return incident.active_at + timedelta(seconds=for_s)
    if incident.status != "firing":
        return None
    times = [t for t in (next_stage_at(incident, stages), incident.last_sent_at + timedelta(seconds=repeat_s)
                         if repeat_s is not None and incident.last_sent_at is not None else None) if t is not None]
    return min(times) if times else None
