"""The engine's audit records (one builder per kind) and the tail of the audit stream the dashboard shows."""

from __future__ import annotations

import collections
from collections.abc import Iterable
from datetime import datetime

from gpuevents.bus import PublishItem
from gpuevents.records import ActionRequest, AuditRecord, audit_messages, decode_audit, transition_id, unique_records
from gpuevents.trusted import Builder
from rules.core.incidents import Transition
from rules.core.inputs import Snooze

AUDIT_TAIL = 400
AUDIT_TAIL_BYTES = 1 << 20  # the newest audit messages kept for the dashboard (a batch's message holds many)


_new_record = Builder(AuditRecord)


def transition_record(t: Transition) -> AuditRecord:
    # Built from a validated Transition whose fields have the record's types: no second validation.
    return _new_record(id=transition_id(t.incident_id, t.from_status, t.to_status), time=t.time, kind="transition",
                       rule=t.rule, entity_id=t.entity_id, cluster=t.cluster, incident_id=t.incident_id,
                       from_status=t.from_status, to_status=t.to_status, detail=t.reason or None)


def reload_record(now: datetime, rules: int) -> AuditRecord:
    return AuditRecord(time=now, kind="reload", detail=f"{rules} rules loaded")


def snooze_record(now: datetime, s: Snooze, pending: str = "", cluster: str = "default") -> AuditRecord:
    """A snooze or keep as applied, with who asked and why (`pending`: what still awaits an approval), in the
    entity's cluster."""
    what = "kept" if s.bounded else "snoozed"
    return AuditRecord(time=now, kind="snooze", rule=s.rule, entity_id=s.entity_id, cluster=cluster,
                       detail=f"{what} until {s.until.isoformat()} by {s.by or '?'}"
                       + (f": {s.reason}" if s.reason else "") + pending)


def request_record(now: datetime, by: str, req: ActionRequest) -> AuditRecord:
    """A person's remedy as the engine decided it, with the facts it used (the runner records what it then did)."""
    return AuditRecord(time=now, kind="request", rule=req.rule, entity_id=req.entity_id, cluster=req.cluster,
                       incident_id=req.incident_id, action_type=req.type, action_key=req.key,
                       outcome="ok" if req.decision == "run" else req.decision, dry_run=req.dry_run,
                       detail=f"asked by {by}: {req.decision}" + (f" ({req.reason})" if req.reason else ""),
                       facts=req.facts)


def audit_items(records: Iterable[AuditRecord]) -> list[PublishItem]:
    """The stream messages that carry `records` (a rule's records of one batch share a message)."""
    return [PublishItem(m.subject, m.payload, msg_id=m.msg_id) for m in audit_messages(records)]


class AuditTail:
    """The newest audit messages (the engine's and the runners'), kept raw and parsed only when asked for."""

    def __init__(self) -> None:
        self._raw: collections.deque[bytes] = collections.deque()
        self._bytes = 0

    def add(self, data: bytes) -> None:
        self._raw.append(data)
        self._bytes += len(data)
        while self._bytes > AUDIT_TAIL_BYTES and len(self._raw) > 1:
            self._bytes -= len(self._raw.popleft())

    def records(self) -> list[AuditRecord]:
        """The newest AUDIT_TAIL audit records, oldest first (unreadable ones left out)."""
        newest: list[list[AuditRecord]] = []
        n = 0
        for raw in reversed(self._raw):
            records = decode_audit(raw)
            newest.append(records)
            n += len(records)
            if n >= AUDIT_TAIL:
                break
        tail = unique_records(r for records in reversed(newest) for r in records)
        tail.sort(key=lambda r: r.time)  # a batch's records are grouped by rule in the stream
        return tail[-AUDIT_TAIL:]
