"""Event models round-trip through JSON; subjects escape node names reversibly."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gpuevents import subjects as S
from gpuevents.events import (
    EVENT_TYPES,
    AgentInfo,
    DemandEntry,
    DemandReport,
    GpuInfo,
    GpuXid,
    JobEnded,
    NodeInfo,
    NodeSnapshot,
    ProcessInfo,
    decode_event,
    encode_event,
    make_event,
    new_id,
    ulid_text,
)

names = st.text(min_size=1, max_size=40)
times = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1),
                     timezones=st.just(UTC))
opt_float = st.none() | st.floats(min_value=0, max_value=1e6, allow_nan=False)

gpus = st.builds(GpuInfo, node=names, index=st.integers(0, 63), uuid=st.text(max_size=40),
                 util_pct=opt_float, mem_used_mib=opt_float, temp_c=opt_float, idle=st.booleans(),
                 idle_since=st.none() | times, pids=st.lists(st.integers(1, 2**22), max_size=5),
                 mig_parent=st.none() | st.text(max_size=10))
procs = st.builds(ProcessInfo, node=names, pid=st.integers(1, 2**22), name=st.text(max_size=30),
                  cmdline=st.text(max_size=100), user=st.none() | names, create_time=times,
                  gpus=st.lists(st.integers(0, 7), max_size=3), pod=st.none() | names,
                  labels=st.dictionaries(names, st.text(max_size=10), max_size=3))
snapshots = st.builds(NodeSnapshot,
                      node=st.builds(NodeInfo, name=names, labels=st.dictionaries(names, names, max_size=3)),
                      gpus=st.lists(gpus, max_size=4), processes=st.lists(procs, max_size=4))


@given(snap=snapshots, when=times, cluster=names)
def test_snapshot_round_trip(snap: NodeSnapshot, when: datetime, cluster: str) -> None:
    e = make_event("node.snapshot", snap.node.name, snap, cluster=cluster, time=when)
    back = decode_event(encode_event(e))
    assert back == e
    assert back.node == snap.node.name


@given(gpu=gpus, kind=st.sampled_from(["gpu.idle", "gpu.active", "gpu.hot", "gpu.memory_full", "gpu.lost"]))
def test_gpu_event_round_trip(gpu: GpuInfo, kind: str) -> None:
    e = make_event(kind, gpu.node, gpu)
    assert decode_event(encode_event(e)) == e


@given(proc=procs, kind=st.sampled_from(["process.started", "process.ended"]))
def test_process_event_round_trip(proc: ProcessInfo, kind: str) -> None:
    e = make_event(kind, proc.node, proc)
    assert decode_event(encode_event(e)) == e


def test_every_event_type_decodes() -> None:
    now = datetime(2026, 1, 5, tzinfo=UTC)
    gpu = GpuInfo(node="n", index=0)
    payloads = {
        "node.snapshot": NodeSnapshot(node=NodeInfo(name="n")),
        "gpu.xid": GpuXid(node="n", index=0, xid=79),
        "process.started": ProcessInfo(node="n", pid=1, create_time=now),
        "process.ended": ProcessInfo(node="n", pid=1, create_time=now),
        "agent.started": AgentInfo(node="n"),
        "agent.stopping": AgentInfo(node="n"),
        "scheduler.demand": DemandReport(scheduler="slurm", entries=[DemandEntry(partition="gpu", pending_gpus=4)]),
        "job.ended": JobEnded(id="42", ended_at=now, gpu_count=4, mean_util_pct=12, cost=41),
    }
    for t in EVENT_TYPES:
        e = make_event(t, "n", payloads.get(t, gpu), time=now)
        assert decode_event(encode_event(e)).type == t


def test_envelope_has_the_cloudevents_fields() -> None:
    e = make_event("gpu.idle", "node-7", GpuInfo(node="node-7", index=0), cluster="c1")
    import orjson

    obj = orjson.loads(encode_event(e))
    assert obj["specversion"] == "1.0"
    assert obj["source"] == "node/node-7"
    assert obj["cluster"] == "c1"
    assert obj["type"] == "gpu.idle"
    assert obj["time"].endswith("Z")
    assert len(obj["id"]) == 26


def test_a_malformed_event_is_rejected() -> None:
    with pytest.raises(ValidationError):
        decode_event(b'{"type": "gpu.idle", "source": "node/x"}')
    with pytest.raises(ValidationError):
        decode_event(b"not json")
    with pytest.raises(ValidationError):
        decode_event(b'{"type": "gpu.bogus", "source": "node/x", "time": "2026-01-01T00:00:00Z", "data": {}}')


def test_ids_sort_by_time() -> None:
    base = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
    ids = [new_id(base + i * 1000) for i in range(50)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 50


@given(value=st.integers(min_value=0, max_value=2**128 - 1))
def test_ulid_text_is_crockford_base32_of_the_value(value: int) -> None:
    text = ulid_text(value)
    digits, v = [], value
    for _ in range(26):  # the reference: 26 base-32 digits, most significant first
        digits.append("0123456789ABCDEFGHJKMNPQRSTVWXYZ"[v & 31])
        v >>= 5
    assert text == "".join(reversed(digits))


@given(name=names)
def test_escape_is_reversible_and_a_valid_token(name: str) -> None:
    token = S.escape_token(name)
    assert S.unescape_token(token) == name
    assert token and not any(c in token for c in ". *>\t\r\n")


@given(cluster=names, node=names, kind=st.sampled_from(EVENT_TYPES))
def test_event_subject_parses_back(cluster: str, node: str, kind: str) -> None:
    subject = S.event_subject(cluster, node, kind)
    assert S.parse_event_subject(subject) == (cluster, node, kind)


def test_subject_shapes() -> None:
    assert S.event_subject("c1", "node-7", "gpu.idle") == "gpuevents.evt.c1.node-7.gpu.idle"
    assert S.command_subject("c1", "node-7", "kill") == "gpuevents.cmd.c1.node-7.kill"
    assert S.action_subject("acme.preempt") == "gpuevents.act.acme.preempt"
    assert S.audit_subject("idle-gpu-2h") == "gpuevents.audit.idle-gpu-2h"
    assert S.function_subject("notify") == "gpuevents.fn.notify"
    assert S.dlq_subject("gpuevents.evt.c1.n.gpu.idle") == "gpuevents.dlq.evt.c1.n.gpu.idle"
    with pytest.raises(S.SubjectError):
        S.parse_event_subject("other.evt.c1.n.gpu")


def test_distinct_names_never_share_a_token() -> None:
    assert S.escape_token("a.b") != S.escape_token("a%2Eb")
    assert S.escape_token("a b") != S.escape_token("a_b")


@given(seconds=st.floats(min_value=0, max_value=10 * 365 * 86400, allow_nan=False))
def test_a_duration_survives_json(seconds: float) -> None:
    from gpuevents.durations import exact_duration, parse_duration

    back = parse_duration(exact_duration(seconds))
    # to the millisecond: at most half of one away (a tie such as 2.5 ms may round either way)
    assert abs(back - seconds) <= 0.0005 + 4 * math.ulp(seconds)
    assert exact_duration(back) == exact_duration(seconds)


def test_durations_parse_and_format() -> None:
    from gpuevents.durations import DurationError, format_duration, parse_duration

    assert parse_duration("90s") == 90
    assert parse_duration("1h30m") == 5400
    assert parse_duration("1d") == 86400
    assert parse_duration("500ms") == 0.5
    assert format_duration(7500) == "2h 5m"
    for bad in ("two hours", "2 h x", "", "-1s", "1x"):
        with pytest.raises(DurationError):
            parse_duration(bad)


def test_an_absurd_duration_is_a_malformed_event() -> None:
    e = make_event("gpu.idle", "n", GpuInfo(node="n", index=0))
    import orjson

    obj = orjson.loads(encode_event(e))
    obj["data"]["idle_for_s"] = 1e300
    with pytest.raises(ValidationError):
        decode_event(orjson.dumps(obj))
    obj["data"]["idle_for_s"] = -5
    with pytest.raises(ValidationError):
        decode_event(orjson.dumps(obj))
