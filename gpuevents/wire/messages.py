"""The agents' messages as msgspec Structs: the typed form the engine decodes the stream with (DESIGN §2, §8).

The JSON is DESIGN §2's, unchanged: these Structs read exactly the fields of the models in gpuevents/events.py
(tests/gpuevents/test_wire_messages.py holds the two field for field, defaults and bounds included). What differs
from validating the same bytes with pydantic, and how `decode` keeps it from showing:

- **Strict, then lax.** msgspec reads the values their own JSON types give (a number for a number, `true` for a
  bool, an RFC 3339 string for a time). Anything else a third-party publisher sends (`"5"` for an int, `1` for a
  bool, a Unix timestamp for a time, `5.0` for an int) fails here and `decode` answers None; the caller then takes
  the pydantic path, which accepts exactly what it always accepted and refuses the rest with its reason (the
  dead-letter queue's `Gpuevents-Error`).
- **Times are UTC.** An offset (`+02:00`) is converted to UTC; a time without one is read as UTC, as DESIGN §2
  says times are (`utc_event` does the same on the pydantic path).
- **Only the agents' events** (`node.snapshot`, `gpu.*`, `process.*`, `agent.*`) have a Struct; the engine's own
  scheduler events (`scheduler.demand`, `job.ended`) are few and keep the pydantic path.

The result is the engine's own model of the event (gpuevents/events.py): its envelope built from the decoded values
without validating them a second time (`_built`), its `data` the decoded Struct itself (gpuevents/agentdata.py),
which is what the engine keeps.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar, cast, get_args

import msgspec
from pydantic import BaseModel

from gpuevents import events as E
from gpuevents.agentdata import (
    AgentInfo,
    GpuInfo,
    GpuXid,
    JobInfo,
    NodeInfo,
    NodeSnapshot,
    ProcessInfo,
    Time,
    struct_of,
    utc_values,
)


class Envelope(msgspec.Struct, kw_only=True, frozen=True):
    """The CloudEvents envelope; `data` is kept as its raw JSON until `type` says what it is."""

    specversion: Literal["1.0"] = "1.0"
    id: str | msgspec.UnsetType = msgspec.UNSET  # absent: a new one, as pydantic's default gives (null: refused)
    source: str
    cluster: str = "default"
    time: Time
    type: str
    data: msgspec.Raw


STRUCTS: dict[type[BaseModel], type[msgspec.Struct]] = {
    E.NodeInfo: NodeInfo, E.GpuInfo: GpuInfo, E.GpuXid: GpuXid, E.ProcessInfo: ProcessInfo, E.JobInfo: JobInfo,
    E.NodeSnapshot: NodeSnapshot, E.AgentInfo: AgentInfo,
}
"""Each model of gpuevents/events.py that has a Struct here, and that Struct."""

M = TypeVar("M", bound=BaseModel)
_new = object.__new__
_set = object.__setattr__


_ALL_SET: dict[type[BaseModel], set[str]] = {}


def _built(cls: type[M], values: dict[str, Any]) -> M:
    """`cls` holding `values` (every field, already valid), built without validating them again: what
    `model_construct` does (gpuevents/trusted.py), less its per-field defaults and checks, which the Struct
    already applied. Every field counts as set; the models are frozen, so they share that one set (pydantic
    copies it before changing it, in `model_copy`)."""
    m = _new(cls)
    _set(m, "__dict__", values)
    names = _ALL_SET.get(cls)
    if names is None:
        names = _ALL_SET[cls] = set(cls.model_fields)
    _set(m, "__pydantic_fields_set__", names)
    _set(m, "__pydantic_extra__", None)
    _set(m, "__pydantic_private__", None)
    return m


def _utc(t: datetime) -> datetime:
    return t if t.tzinfo is UTC else t.astimezone(UTC)


def _utc_opt(t: datetime | None) -> datetime | None:
    return t if t is None or t.tzinfo is UTC else t.astimezone(UTC)


_replace = msgspec.structs.replace
_ZERO = timedelta(0)
_NODE_TIMES = ("last_seen", "diag_started_at", "diag_passed_at", "diag_failed_at")


def _gpu(g: GpuInfo) -> GpuInfo:
    a, b = g.idle_since, g.xid_at
    if (a is None or a.tzinfo is UTC) and (b is None or b.tzinfo is UTC):
        return g
    return _replace(g, idle_since=_utc_opt(a), xid_at=_utc_opt(b))


def _process(p: ProcessInfo) -> ProcessInfo:
    return p if p.create_time.tzinfo is UTC else _replace(p, create_time=_utc(p.create_time))


def _job(j: JobInfo) -> JobInfo:
    t = j.started_at
    return j if t is None or t.tzinfo is UTC else _replace(j, started_at=_utc(t))


def _snapshot(s: NodeSnapshot) -> NodeSnapshot:
    """`s` with every time in UTC: itself when they are (the agents send UTC), else a copy of what is not."""
    n = s.node
    node = n if all(_utc_opt(getattr(n, k)) is getattr(n, k) for k in _NODE_TIMES) else _replace(
        n, **{k: _utc_opt(getattr(n, k)) for k in _NODE_TIMES})
    gpus, processes, jobs = list(map(_gpu, s.gpus)), list(map(_process, s.processes)), list(map(_job, s.jobs))
    if node is n and _same(gpus, s.gpus) and _same(processes, s.processes) and _same(jobs, s.jobs):
        return s
    return _replace(s, node=node, gpus=gpus, processes=processes, jobs=jobs)


def _same(a: list[Any], b: list[Any]) -> bool:
    return all(x is y for x, y in zip(a, b, strict=True))


def _agent(a: AgentInfo) -> AgentInfo:
    return a


_Payload = tuple[type[BaseModel], msgspec.json.Decoder[Any], Callable[[Any], msgspec.Struct]]


def _payload(model: type[BaseModel], struct: type[msgspec.Struct], to: Callable[[Any], msgspec.Struct]) -> _Payload:
    return model, msgspec.json.Decoder(struct), to


_GPU = _payload(E.GpuEvent, GpuInfo, _gpu)
_PROCESS = _payload(E.ProcessEvent, ProcessInfo, _process)
_AGENT = _payload(E.AgentEvent, AgentInfo, _agent)
_PAYLOADS: dict[str, _Payload] = {
    "node.snapshot": _payload(E.SnapshotEvent, NodeSnapshot, _snapshot),
    **dict.fromkeys(get_args(E.GpuEventType), _GPU),
    "gpu.xid": _payload(E.GpuXidEvent, GpuXid, _gpu),
    **dict.fromkeys(get_args(E.ProcessEventType), _PROCESS),
    **dict.fromkeys(get_args(E.AgentEventType), _AGENT),
}
"""Each of the agents' event types: its event model, the decoder of its `data`, and what puts that data's times
in UTC."""
_ENVELOPE = msgspec.json.Decoder(Envelope)


def envelope(raw: bytes) -> Envelope | None:
    """The envelope of the event `raw` holds, its `data` left raw; None when it is not one in the Structs' terms."""
    try:
        return _ENVELOPE.decode(raw)
    except msgspec.DecodeError:  # ValidationError is one
        return None


def decode(raw: bytes) -> E.Event | None:
    """The event `raw` holds, decoded with the Structs; None when it is not one of the agents' events or any of
    its values is not of its field's own JSON type (the pydantic path then decides, see the module's doc)."""
    env = envelope(raw)
    payload = _PAYLOADS.get(env.type) if env is not None else None
    if env is None or payload is None:
        return None
    model, decoder, to = payload
    try:
        data = to(decoder.decode(env.data))
    except msgspec.DecodeError:
        return None
    return cast("E.Event", with_data(env, model, data))


def with_data(env: Envelope, model: type[M], data: msgspec.Struct) -> M:
    """The event `model` of `env` (its time in UTC) carrying `data`, already valid."""
    t = _utc(env.time)
    return _built(model, {
        "specversion": "1.0", "id": env.id if isinstance(env.id, str) else E.new_id(int(t.timestamp() * 1000)),
        "source": env.source, "cluster": env.cluster, "time": t, "type": env.type, "data": data})


def as_struct(model: BaseModel) -> msgspec.Struct:
    """The Struct of `STRUCTS` holding the values of `model` (one of the agents' data models, already valid), every
    time in it in UTC (one without an offset read as UTC): what an event's `data` is made of a validated model."""
    return struct_of(model.model_dump(), STRUCTS[type(model)])


def utc_event(event: E.Event) -> E.Event:
    """`event` with every time in it in UTC (one without an offset read as UTC): what `decode` gives too. An agent
    event's data is UTC already (its Struct is made so)."""
    if _all_utc(event):
        return event
    return type(event).model_validate(utc_values(event.model_dump()))


def _all_utc(value: object) -> bool:
    if isinstance(value, datetime):
        return value.tzinfo is not None and value.utcoffset() == _ZERO
    if isinstance(value, BaseModel):
        return all(_all_utc(v) for v in value.__dict__.values())
    if isinstance(value, list):
        return all(_all_utc(v) for v in value)
    return True
