"""The engine's audit records and the audit tail the dashboard reads."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpuevents.records import AuditRecord, audit_messages
from rules.core.inputs import Snooze
from rules.engine import audit
from rules.engine.audit import AuditTail, reload_record, snooze_record
from tests.rules.engine.conftest import T0


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
    assert rec.detail == f"until {s.until.isoformat()} by alice: demo"
    assert reload_record(T0, 3).detail == "3 rules loaded"
