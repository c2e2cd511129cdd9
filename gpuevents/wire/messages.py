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

The result is the engine's own model of the event (gpuevents/events.py), built from the decoded values without
validating them a second time (`_built`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, TypeVar, cast, get_args

import msgspec
from pydantic import BaseModel

from gpuevents import events as E

_Age = Annotated[float, msgspec.Meta(ge=0, le=E.MAX_AGE_S)]
_Time = Annotated[datetime, msgspec.Meta(tz=True)]  # naive: the pydantic path, which reads it as UTC


class NodeInfo(msgspec.Struct, kw_only=True, frozen=True):
    name: str
    cluster: str = "default"
    labels: dict[str, str] = {}
    gpu_count: int = 0
    gpus_busy: int = 0
    gpus_idle: int = 0
    online: bool = True
    last_seen: _Time | None = None
    cordoned: bool | None = None
    driver_version: str | None = None
    hostname: str | None = None
    agent_id: str | None = None
    diag_status: Literal["running", "passed", "failed"] | None = None
    diag_started_at: _Time | None = None
    diag_passed_at: _Time | None = None
    diag_failed_at: _Time | None = None
    diag_exit_code: int | None = None
    diag_output: str | None = None


class GpuInfo(msgspec.Struct, kw_only=True, frozen=True):
    node: str
    index: int
    uuid: str = ""
    model: str | None = None
    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    mem_pct: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    fan_pct: float | None = None
    ecc_uncorrected: int | None = None
    idle: bool = False
    activity_known: bool = True
    idle_since: _Time | None = None
    idle_for_s: _Age | None = None
    pids: list[int] = []
    owners: list[str] = []
    owner: str | None = None
    mig_parent: str | None = None
    lost: bool = False
    xid: int | None = None
    xid_at: _Time | None = None
    allocated: bool | None = None
    job: str | None = None
    sm_active_pct: float | None = None
    tensor_active_pct: float | None = None
    row_remap_pending: bool | None = None
    power_cap_w: float | None = None
    power_cap_saved_w: float | None = None


class GpuXid(GpuInfo, kw_only=True, frozen=True):
    xid: int  # required here, as in events.GpuXid


class ProcessInfo(msgspec.Struct, kw_only=True, frozen=True):
    node: str
    pid: int
    name: str = ""
    exe: str = ""
    cmdline: str = ""
    user: str | None = None
    uid: int | None = None
    owner: str | None = None
    create_time: _Time
    age_s: _Age | None = None
    ppid: int | None = None
    job: str | None = None
    service: str | None = None
    gpus: list[int] = []
    gpu_mem_mib: float | None = None
    gpu_util_pct: float | None = None
    container_id: str | None = None
    pod_uid: str | None = None
    pod: str | None = None
    labels: dict[str, str] = {}


class JobInfo(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    scheduler: Literal["slurm", "kubernetes"] = "slurm"
    name: str | None = None
    user: str | None = None
    owner: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    namespace: str | None = None
    controller: str | None = None
    gpus: list[int] = []
    pids: list[int] = []
    started_at: _Time | None = None
    time_limit_s: Annotated[float, msgspec.Meta(ge=0)] | None = None
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    pods: list[str] = []
    controller_uid: str | None = None
    controller_generation: int | None = None


class NodeSnapshot(msgspec.Struct, kw_only=True, frozen=True):
    node: NodeInfo
    jobs: list[JobInfo] = []
    gpus: list[GpuInfo] = []
    processes: list[ProcessInfo] = []


class AgentInfo(msgspec.Struct, kw_only=True, frozen=True):
    node: str
    version: str = ""
    sampler: str = ""
    hostname: str | None = None
    pid: int | None = None
    agent_id: str | None = None
    sample_interval_s: float | None = None
    snapshot_interval_s: float | None = None


class Envelope(msgspec.Struct, kw_only=True, frozen=True):
    """The CloudEvents envelope; `data` is kept as its raw JSON until `type` says what it is."""

    specversion: Literal["1.0"] = "1.0"
    id: str | msgspec.UnsetType = msgspec.UNSET  # absent: a new one, as pydantic's default gives (null: refused)
    source: str
    cluster: str = "default"
    time: _Time
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


_asdict = msgspec.structs.asdict
_ZERO = timedelta(0)


def _gpu(g: GpuInfo, cls: type[E.GpuInfo] = E.GpuInfo) -> E.GpuInfo:
    d = _asdict(g)
    if g.idle_since is not None or g.xid_at is not None:
        d["idle_since"] = _utc_opt(g.idle_since)
        d["xid_at"] = _utc_opt(g.xid_at)
    return _built(cls, d)


def _process(p: ProcessInfo) -> E.ProcessInfo:
    d = _asdict(p)
    d["create_time"] = _utc(p.create_time)
    return _built(E.ProcessInfo, d)


def _job(j: JobInfo) -> E.JobInfo:
    d = _asdict(j)
    d["started_at"] = _utc_opt(j.started_at)
    return _built(E.JobInfo, d)


def _snapshot(s: NodeSnapshot) -> E.NodeSnapshot:
    node = _asdict(s.node)
    for k in ("last_seen", "diag_started_at", "diag_passed_at", "diag_failed_at"):
        node[k] = _utc_opt(node[k])
    return _built(E.NodeSnapshot, {
        "node": _built(E.NodeInfo, node),
        "jobs": [_job(j) for j in s.jobs],
        "gpus": [_gpu(g) for g in s.gpus],
        "processes": [_process(p) for p in s.processes],
    })


def _xid(g: GpuXid) -> E.GpuInfo:
    return _gpu(g, E.GpuXid)


def _agent(a: AgentInfo) -> E.AgentInfo:
    return _built(E.AgentInfo, _asdict(a))


_Payload = tuple[type[BaseModel], msgspec.json.Decoder[Any], Callable[[Any], BaseModel]]


def _payload(model: type[BaseModel], struct: type[msgspec.Struct], to: Callable[[Any], BaseModel]) -> _Payload:
    return model, msgspec.json.Decoder(struct), to


_GPU = _payload(E.GpuEvent, GpuInfo, _gpu)
_PROCESS = _payload(E.ProcessEvent, ProcessInfo, _process)
_AGENT = _payload(E.AgentEvent, AgentInfo, _agent)
_PAYLOADS: dict[str, _Payload] = {
    "node.snapshot": _payload(E.SnapshotEvent, NodeSnapshot, _snapshot),
    **dict.fromkeys(get_args(E.GpuEventType), _GPU),
    "gpu.xid": _payload(E.GpuXidEvent, GpuXid, _xid),
    **dict.fromkeys(get_args(E.ProcessEventType), _PROCESS),
    **dict.fromkeys(get_args(E.AgentEventType), _AGENT),
}
"""Each of the agents' event types: its event model, the decoder of its `data`, and what makes that data the
model's."""
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


def with_data(env: Envelope, model: type[M], data: BaseModel) -> M:
    """The event `model` of `env` (its time in UTC) carrying `data`, already valid."""
    t = _utc(env.time)
    return _built(model, {
        "specversion": "1.0", "id": env.id if isinstance(env.id, str) else E.new_id(int(t.timestamp() * 1000)),
        "source": env.source, "cluster": env.cluster, "time": t, "type": env.type, "data": data})


def as_struct(model: BaseModel) -> msgspec.Struct:
    """The Struct of `STRUCTS` holding the values of `model` (one of the agents' data models, already valid), every
    time in it in UTC (one without an offset read as UTC): how what the pydantic path validated (a third party's
    lax values, an event a rule test wrote) is made the engine's one type once. Nested models become their
    Structs too."""
    struct = STRUCTS[type(model)]
    return msgspec.convert(_utc_values(model.model_dump()), struct)


def utc_event(event: E.Event) -> E.Event:
    """`event` with every time in it in UTC (one without an offset read as UTC): what `decode` gives too."""
    if _all_utc(event):
        return event
    return type(event).model_validate(_utc_values(event.model_dump()))


def _all_utc(value: object) -> bool:
    if isinstance(value, datetime):
        return value.tzinfo is not None and value.utcoffset() == _ZERO
    if isinstance(value, BaseModel):
        return all(_all_utc(v) for v in value.__dict__.values())
    if isinstance(value, list):
        return all(_all_utc(v) for v in value)
    return True


def _utc_values(value: object) -> object:
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, dict):
        return {k: _utc_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utc_values(v) for v in value]
    return value
