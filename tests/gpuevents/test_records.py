"""Action requests and audit messages on the wire: subjects, message ids, grouping by rule, reading back."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuevents.records import ActionRequest, AuditRecord, action_message, audit_messages, decode_audit

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def record(rule: str, n: int) -> AuditRecord:
    return AuditRecord(time=T0, kind="transition", rule=rule, entity_id=f"n{n}/gpu0",
                       from_status="inactive", to_status="pending")


def test_records_are_grouped_by_rule_in_order_and_read_back() -> None:
    records = [record("idle", 0), record("ghost", 1), record("idle", 2), record("", 3)]
    messages = audit_messages(records)
    assert [(m.subject, m.count) for m in messages] == [
        ("gpuevents.audit.idle", 2), ("gpuevents.audit.ghost", 1), ("gpuevents.audit.engine", 1)]
    assert decode_audit(messages[0].payload) == [records[0], records[2]]
    assert messages[0].msg_id == f"{records[0].id}+2"
    # a single record is plain JSON, as the action runner writes it
    assert AuditRecord.model_validate_json(messages[1].payload) == records[1]


def test_messages_are_split_at_the_size_limit_and_the_same_records_give_the_same_ids() -> None:
    records = [record("idle", n) for n in range(10)]
    line = len(records[0].model_dump_json()) + 1
    messages = audit_messages(records, max_bytes=3 * line)
    assert [m.count for m in messages] == [3, 3, 3, 1]
    assert all(len(m.payload) <= 3 * line for m in messages)
    assert [r for m in messages for r in decode_audit(m.payload)] == records
    assert [m.msg_id for m in audit_messages(records, max_bytes=3 * line)] == [m.msg_id for m in messages]
    assert len({m.msg_id for m in messages}) == 4


def test_unreadable_lines_are_left_out() -> None:
    good = record("idle", 0)
    payload = b"\n".join([b"{not json", good.model_dump_json().encode(), b"", b'{"kind": "nonsense"}'])
    assert decode_audit(payload) == [good]


def test_an_action_request_goes_out_under_its_key_as_message_id() -> None:
    request = ActionRequest.model_validate({
        "key": "inc-1:fire:0:0", "type": "acme.preempt", "params": {}, "rule": "r", "entity_id": "n1/gpu0",
        "entity_kind": "gpu", "incident_id": "inc-1", "created_at": "2026-01-05T00:00:00Z"})
    subject, payload, msg_id = action_message(request)
    assert (subject, msg_id) == ("gpuevents.act.acme.preempt", "inc-1:fire:0:0")
    assert ActionRequest.model_validate_json(payload) == request
