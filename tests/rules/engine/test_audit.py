"""The engine's audit records and the audit tail the dashboard reads."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from gpuevents.config import Config
from gpuevents.records import AuditRecord, audit_messages
from rules.core.core import Core, Tick
from rules.core.inputs import Snooze
from rules.engine import audit
from rules.engine.audit import AuditTail, reload_record, snooze_record, transition_record
from tests.rules.engine.conftest import T0
from tests.rules.helpers import IDLE, at, held_idle, rules_from


def test_the_tail_keeps_the_newest_records_oldest_first_and_skips_unreadable_messages() -> None:
    tail = AuditTail()
    for i in range(5):
        records = [AuditRecord(time=T0 + timedelta(seconds=i), kind="reload", detail=f"r{i}")]
        for m in audit_messages(records):
            tail.add(m.payload)
    tail.add(b"not json")
    assert [r.detail for r in tail.records()] == ["r0", "r1", "r2", "r3", "r4"]


def test_the_tail_is_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit, "AUDIT_TAIL_BYTES", 2_000)
    tail = AuditTail()
    for i in range(100):
        tail.add(AuditRecord(time=T0, kind="reload", detail=f"r{i}").model_dump_json().encode())
    kept = tail.records()
    assert 0 < len(kept) < 100
    assert kept[-1].detail == "r99"


def test_snooze_and_reload_records_say_what_happened() -> None:
    s = Snooze(rule="idle", entity_id="n1/gpu0", until=T0 + timedelta(hours=4), by="alice", reason="demo")
    rec = snooze_record(T0, s)
    assert (rec.kind, rec.rule, rec.entity_id) == ("snooze", "idle", "n1/gpu0")
    assert rec.detail == f"snoozed until {s.until.isoformat()} by alice: demo"
    assert reload_record(T0, 3).detail == "3 rules loaded"


def test_a_transition_recorded_again_after_a_crash_is_shown_once(tmp_path: Path) -> None:
    """An engine that dies between publishing a batch's audit and writing its incidents: the next one restores
    the incident as it was (pending) and fires it again. The action is deduplicated by its key; the transition
    has the same record id, so the audit tail (and `gpuevents audit`) shows it once."""
    rules = rules_from(tmp_path, IDLE.format(extra="for: 1m"))
    slow = Config.model_validate({"agent": {"snapshot_interval": "1h"}})  # n1 stays online between snapshots
    first = Core(rules, slow)
    first.step(held_idle(0), at(0))
    pending = first.open_incidents()
    fired = first.step(Tick(), at(61)).transitions
    again = Core(rules, slow)
    again.restore(pending, now=at(90))
    refired = again.step(held_idle(95), at(95)).transitions + again.step(Tick(), at(200)).transitions
    assert [t.to_status for t in fired] == [t.to_status for t in refired] == ["firing"]
    records = [transition_record(t) for t in (*fired, *refired)]
    assert records[0].id == records[1].id
    tail = AuditTail()
    for m in audit_messages(records[:1]) + audit_messages(records[1:]):
        tail.add(m.payload)
    assert [(r.from_status, r.to_status) for r in tail.records()] == [("pending", "firing")]
