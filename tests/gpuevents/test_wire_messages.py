"""The agents' messages as msgspec Structs: the same fields as the models, the same events out of the same bytes,
and the pydantic path's acceptance kept for lax input; every time in UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from gpuevents import agentdata
from gpuevents import events as E
from gpuevents.wire import messages
from rules.intake.decoder import decode
from tests.quick import examples
from tests.rules.helpers import T0, gpu, proc, snapshot


def _struct_fields(struct: type[msgspec.Struct]) -> dict[str, tuple[bool, Any]]:
    out = {}
    for f in msgspec.structs.fields(struct):
        default = f.default if f.default is not msgspec.NODEFAULT else (
            f.default_factory() if f.default_factory is not msgspec.NODEFAULT else None)
        out[f.name] = (f.required, default)
    return out


def _model_fields(model: type[BaseModel]) -> dict[str, tuple[bool, Any]]:
    return {n: (f.is_required(), None if f.is_required() else f.get_default(call_default_factory=True))
            for n, f in model.model_fields.items()}


@pytest.mark.parametrize("model", list(messages.STRUCTS), ids=lambda m: m.__name__)
def test_each_struct_has_its_models_fields_in_order_with_its_defaults(model: type[BaseModel]) -> None:
    struct = messages.STRUCTS[model]
    assert list(_struct_fields(struct).items()) == list(_model_fields(model).items())


def test_the_envelope_has_the_models_fields() -> None:
    envelope = set(_struct_fields(messages.Envelope))
    for model in (E.SnapshotEvent, E.GpuEvent, E.GpuXidEvent, E.ProcessEvent, E.AgentEvent):
        assert set(model.model_fields) == envelope


def raw(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj)


def agent_snapshot() -> dict[str, Any]:
    snap = snapshot(T0, "n1", gpus=[gpu(0, 3.0, pids=[42], idle_for_s=600.0), gpu(1)], processes=[proc(42)])
    obj: dict[str, Any] = orjson.loads(E.encode_event(snap))
    obj["data"]["jobs"] = [E.JobInfo(id="123", gpus=[0], pids=[42]).model_dump(mode="json")]
    return obj


def test_an_agents_snapshot_takes_the_structs_and_equals_the_pydantic_result() -> None:
    data = raw(agent_snapshot())
    fast = messages.decode(data)
    assert fast is not None  # the Structs took it
    assert fast == E.decode_event(data) and E.encode_event(fast) == E.encode_event(E.decode_event(data))
    assert isinstance(fast, E.SnapshotEvent) and isinstance(fast.data.gpus[0], agentdata.GpuInfo)


@pytest.mark.parametrize(("where", "field", "value", "expected"), [
    ("gpu", "index", "0", 0),  # ints as strings, as some third-party publishers send them
    ("gpu", "util_pct", "3.5", 3.5),
    ("gpu", "index", 0.0, 0),
    ("gpu", "idle", "yes", True),
    ("gpu", "idle", 1, True),
    ("process", "pid", "42", 42),
    ("process", "create_time", 1_767_571_200, datetime(2026, 1, 5, tzinfo=UTC)),  # a Unix time
])
def test_lax_values_take_the_pydantic_path_and_are_read_as_it_reads_them(
        where: str, field: str, value: Any, expected: Any) -> None:
    obj = agent_snapshot()
    item = obj["data"]["gpus" if where == "gpu" else "processes"][0]
    item[field] = value
    data = raw(obj)
    assert messages.decode(data) is None  # not the Structs' own JSON type: pydantic decides
    event = decode(data)
    assert isinstance(event, E.SnapshotEvent)
    got = getattr(event.data.gpus[0] if where == "gpu" else event.data.processes[0], field)
    assert got == expected


@pytest.mark.parametrize(("where", "field", "value"), [
    ("gpu", "index", "zero"), ("gpu", "index", 1.5), ("gpu", "idle", "maybe"), ("gpu", "idle_for_s", -1.0),
    ("gpu", "pids", ["x"]), ("process", "create_time", "yesterday"), ("process", "age_s", 1e12),
    ("gpu", "owner", 7),
])
def test_what_neither_path_takes_is_refused_with_pydantics_reason(where: str, field: str, value: Any) -> None:
    obj = agent_snapshot()
    obj["data"]["gpus" if where == "gpu" else "processes"][0][field] = value
    with pytest.raises(ValidationError, match=field):
        decode(raw(obj))


@pytest.mark.parametrize("time", ["2026-01-05T02:00:00+02:00", "2026-01-05T00:00:00", "2026-01-05T00:00:00Z",
                                  "2026-01-04T19:00:00-05:00"])
def test_every_time_comes_out_in_utc(time: str) -> None:
    obj = agent_snapshot()
    obj["time"] = time
    obj["data"]["processes"][0]["create_time"] = time
    obj["data"]["gpus"][0]["idle_since"] = time
    event = decode(raw(obj))
    assert isinstance(event, E.SnapshotEvent)
    instant = datetime(2026, 1, 5, tzinfo=UTC)
    for t in (event.time, event.data.processes[0].create_time, event.data.gpus[0].idle_since):
        assert t == instant and t is not None and t.utcoffset() == timedelta(0)
        assert t.isoformat() == "2026-01-05T00:00:00+00:00"


def test_a_naive_time_is_read_as_utc_on_the_pydantic_path_too() -> None:
    obj = agent_snapshot()
    obj["time"] = "2026-01-05T00:00:00"
    obj["data"]["gpus"][0]["index"] = "0"  # and lax: pydantic decides
    assert messages.decode(raw(obj)) is None
    assert decode(raw(obj)).time == datetime(2026, 1, 5, tzinfo=UTC)


def test_events_other_than_snapshots_decode_as_pydantic_decodes_them() -> None:
    t = datetime(2026, 1, 5, 1, tzinfo=timezone(timedelta(hours=1)))
    for event in (E.make_event("gpu.hot", "n1", gpu(0, temp_c=91.0), time=T0),
                  E.make_event("gpu.xid", "n1", E.GpuXid(node="n1", index=0, xid=79), time=T0),
                  E.make_event("process.started", "n1", proc(42), time=T0),
                  E.make_event("agent.started", "n1", E.AgentInfo(node="n1", snapshot_interval_s=15.0), time=t)):
        data = E.encode_event(event)
        fast = messages.decode(data)
        assert fast is not None and type(fast) is type(event)
        assert fast == messages.utc_event(E.decode_event(data))
    demand = E.make_event("scheduler.demand", E.SCHEDULER_SOURCE, E.DemandReport(scheduler="slurm"), time=T0)
    assert messages.decode(E.encode_event(demand)) is None and decode(E.encode_event(demand)) == demand


LAX = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False, width=32),
                st.sampled_from(["1", "0", "2.5", "-1", "true", "no", "x", "", "2026-01-05T00:00:00Z",
                                 "2026-01-05T00:00:00", "2026-01-05T01:00:00+01:00"]),
                st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.text(max_size=2), st.text(max_size=2),
                                                                         max_size=1))
GPU_FIELDS = sorted(E.GpuInfo.model_fields)
PROCESS_FIELDS = sorted(E.ProcessInfo.model_fields)
JOB_FIELDS = sorted(E.JobInfo.model_fields)


def _outcome(data: bytes) -> tuple[str, Any]:
    try:
        return ("ok", decode(data))
    except ValidationError:
        return ("invalid", None)


def _pydantic_outcome(data: bytes) -> tuple[str, Any]:
    try:
        return ("ok", messages.utc_event(E.decode_event(data)))
    except ValidationError:
        return ("invalid", None)


FIELDS = [("gpus", f) for f in GPU_FIELDS] + [("processes", f) for f in PROCESS_FIELDS] + [
    ("jobs", f) for f in JOB_FIELDS] + [("node", f) for f in sorted(E.NodeInfo.model_fields)]


@pytest.mark.parametrize(("where", "field"), FIELDS)
@settings(max_examples=examples(40), deadline=None)
@given(value=LAX)
def test_any_value_is_accepted_or_refused_exactly_as_the_pydantic_path_does(where: str, field: str,
                                                                            value: Any) -> None:
    obj = agent_snapshot()
    part = obj["data"][where]
    (part if where == "node" else part[0])[field] = value
    data = raw(obj)
    got, want = _outcome(data), _pydantic_outcome(data)
    assert got == want
    if got[0] == "ok":
        assert E.encode_event(got[1]) == E.encode_event(want[1])


def test_the_data_is_the_struct_the_engine_keeps_and_copies_compare_by_value() -> None:
    a, b = (messages.decode(raw(agent_snapshot())) for _ in range(2))
    assert isinstance(a, E.SnapshotEvent) and isinstance(b, E.SnapshotEvent)
    assert type(a.data) is agentdata.NodeSnapshot and type(a.data.gpus[0]) is agentdata.GpuInfo
    g = a.data.gpus[0]
    copied = msgspec.structs.replace(g, idle_since=T0, xid=79)
    assert copied.idle_since == T0 and copied.xid == 79 and g.xid is None
    assert a.data.gpus[0] == b.data.gpus[0] and a.data.gpus[0] is not b.data.gpus[0]
    # the pydantic path (an event someone wrote) ends in the same Struct, equal to the decoded one
    assert E.SnapshotEvent.model_validate(a.model_dump()) == a


def test_a_validated_model_converts_to_its_struct_field_for_field() -> None:
    naive = datetime(2026, 1, 2, 3, 4, 5)  # read as UTC, as the pydantic path reads it
    snap = E.NodeSnapshot(node=E.NodeInfo(name="n1", labels={"a": "b"}, last_seen=naive),
                          jobs=[E.JobInfo(id="j1", gpus=[1], started_at=T0)],
                          gpus=[gpu(0, idle_since=naive, xid=43, xid_at=T0), gpu(1, 50.0)],
                          processes=[proc(100, gpus=[1], created=T0 - timedelta(hours=1))])
    s = messages.as_struct(snap)
    assert isinstance(s, agentdata.NodeSnapshot)
    assert isinstance(s.gpus[0], agentdata.GpuInfo) and isinstance(s.processes[0], agentdata.ProcessInfo)
    assert isinstance(s.jobs[0], agentdata.JobInfo) and isinstance(s.node, agentdata.NodeInfo)
    assert s.gpus[0].idle_since == naive.replace(tzinfo=UTC) and s.node.last_seen == naive.replace(tzinfo=UTC)
    utc = snap.model_copy(update={"node": snap.node.model_copy(update={"last_seen": naive.replace(tzinfo=UTC)}),
                                  "gpus": [snap.gpus[0].model_copy(update={"idle_since": naive.replace(tzinfo=UTC)}),
                                           snap.gpus[1]]})
    assert msgspec.to_builtins(s) == orjson.loads(utc.model_dump_json())


@pytest.mark.parametrize("model", list(messages.STRUCTS), ids=lambda m: m.__name__)
def test_each_model_converts_to_its_own_struct(model: type[BaseModel]) -> None:
    required: dict[str, Any] = {"name": "n1", "node": "n1", "index": 0, "pid": 1, "id": "j1", "create_time": T0,
                                "xid": 79}
    values = {k: v for k, v in required.items() if k in model.model_fields and model.model_fields[k].is_required()}
    if model is E.NodeSnapshot:
        values = {"node": E.NodeInfo(name="n1")}
    m = model.model_validate(values)
    s = messages.as_struct(m)
    assert type(s) is messages.STRUCTS[model]
    assert msgspec.to_builtins(s) == orjson.loads(m.model_dump_json())
