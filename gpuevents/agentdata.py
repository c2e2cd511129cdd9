"""The agents' data (a node's snapshot, a GPU, a process, a job, an agent) as the engine keeps it: msgspec Structs.

These are the types of an agent event's `data` (gpuevents/events.py), whichever way the event came: decoded
strictly from the stream (gpuevents/wire/messages.py), or validated by pydantic (the lax path for a third party's
values, an event a rule test or a simulator wrote) and then made a Struct once (`struct_of`). Their fields are the
pydantic models' of gpuevents/events.py, in order, with their defaults and bounds (tests/gpuevents/
test_wire_messages.py holds the two field for field); every time in them is UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

import msgspec

MAX_AGE_S = 100 * 365 * 86400.0
"""Durations on the wire are bounded: a corrupt value is a malformed event, not an overflow later."""

_Age = Annotated[float, msgspec.Meta(ge=0, le=MAX_AGE_S)]
Time = Annotated[datetime, msgspec.Meta(tz=True)]  # naive: the pydantic path, which reads it as UTC


class NodeInfo(msgspec.Struct, kw_only=True, frozen=True, weakref=True):
    name: str
    cluster: str = "default"
    labels: dict[str, str] = {}
    gpu_count: int = 0
    gpus_busy: int = 0
    gpus_idle: int = 0
    online: bool = True
    last_seen: Time | None = None
    cordoned: bool | None = None
    driver_version: str | None = None
    hostname: str | None = None
    agent_id: str | None = None
    diag_status: Literal["running", "passed", "failed"] | None = None
    diag_started_at: Time | None = None
    diag_passed_at: Time | None = None
    diag_failed_at: Time | None = None
    diag_exit_code: int | None = None
    diag_output: str | None = None


class GpuInfo(msgspec.Struct, kw_only=True, frozen=True, weakref=True):
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
    idle_since: Time | None = None
    idle_for_s: _Age | None = None
    pids: list[int] = []
    owners: list[str] = []
    owner: str | None = None
    mig_parent: str | None = None
    lost: bool = False
    xid: int | None = None
    xid_at: Time | None = None
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
    create_time: Time
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
    started_at: Time | None = None
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



S = TypeVar("S", bound=msgspec.Struct)
replace = msgspec.structs.replace
"""A Struct with some fields changed (the others shared): what `model_copy(update=...)` is to a model."""


def utc_values(value: object) -> object:
    """`value` (builtins, as `model_dump` gives them) with every time in UTC, one without an offset read as UTC."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, dict):
        return {k: utc_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [utc_values(v) for v in value]
    return value


def struct_of(values: dict[str, Any], struct: type[S]) -> S:
    """`struct` holding `values` (already valid, as a pydantic model's `model_dump` gives them), times in UTC."""
    return msgspec.convert(utc_values(values), struct)
