"""The event contract (DESIGN §2): CloudEvents envelope, one model per payload, JSON on the wire."""

from __future__ import annotations

import os
import time as _time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Literal, get_args, overload

import msgspec
import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, SerializationInfo, TypeAdapter

from gpuevents import agentdata as A

GpuEventType = Literal["gpu.idle", "gpu.active", "gpu.hot", "gpu.memory_full", "gpu.lost"]
ProcessEventType = Literal["process.started", "process.ended"]
AgentEventType = Literal["agent.started", "agent.stopping"]
EventType = Literal[
    "node.snapshot",
    "gpu.idle",
    "gpu.active",
    "gpu.hot",
    "gpu.memory_full",
    "gpu.lost",
    "gpu.xid",
    "process.started",
    "process.ended",
    "agent.started",
    "agent.stopping",
    "scheduler.demand",
    "job.ended",
]
EVENT_TYPES: tuple[str, ...] = get_args(EventType)

MAX_AGE_S = A.MAX_AGE_S

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]  # 10 bits -> 2 characters
_SHIFTS = tuple(range(120, -1, -10))


def ulid_text(value: int) -> str:
    """A 128-bit value as the 26 Crockford base32 characters of a ULID (the first one carries 3 bits)."""
    return "".join([_PAIRS[(value >> s) & 1023] for s in _SHIFTS])


def new_id(now_ms: int | None = None) -> str:
    """A ULID: 48 bits of milliseconds then 80 random bits, Crockford base32, sortable by time."""
    ms = int(_time.time() * 1000) if now_ms is None else now_ms
    return ulid_text((ms << 80) | int.from_bytes(os.urandom(10), "big"))


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class NodeInfo(_Model):
    """A node as the agent sees it; `online` and `last_seen` are set by the engine."""

    name: str
    cluster: str = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    gpu_count: int = 0
    gpus_busy: int = 0
    gpus_idle: int = 0
    online: bool = True
    last_seen: datetime | None = None
    cordoned: bool | None = None
    driver_version: str | None = None
    hostname: str | None = None
    agent_id: str | None = None
    """The agent process that sent it (random per start): two agents claiming one node send two ids."""
    # The site's diagnostic (`agent.diagnostics`, the `diagnose` action): its latest run, none before the first
    diag_status: Literal["running", "passed", "failed"] | None = None
    diag_started_at: datetime | None = None
    diag_passed_at: datetime | None = None  # the end of the latest run that passed
    diag_failed_at: datetime | None = None  # the end of the latest run that failed
    diag_exit_code: int | None = None
    diag_output: str | None = None  # the tail of its output


class GpuInfo(_Model):
    """One GPU (or MIG instance). `pids` are the processes on it; the engine exposes them as `processes`."""

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
    """False while something holds it and nothing measures its activity (an A100/A30 MIG instance without
    dcgm-exporter's profiling): then it is neither idle nor busy, but unknown."""
    idle_since: datetime | None = None
    idle_for_s: float | None = Field(None, ge=0, le=MAX_AGE_S)
    pids: list[int] = Field(default_factory=list)
    owners: list[str] = Field(default_factory=list)
    owner: str | None = None
    mig_parent: str | None = None
    lost: bool = False
    xid: int | None = None  # the last XID error the GPU reported (the engine keeps it across snapshots)
    xid_at: datetime | None = None
    allocated: bool | None = None
    """A scheduler (Slurm, the kubelet) has allocated it to a job; None where no scheduler integration says."""
    job: str | None = None
    """The job it is allocated to (a Slurm job id, a pod's namespace/name)."""
    # NVML GPM (Hopper and later, MIG instances too); null where the GPU has no GPM
    sm_active_pct: float | None = None  # share of SMs busy over the last sample interval
    tensor_active_pct: float | None = None  # share of time the tensor cores were busy
    row_remap_pending: bool | None = None  # a row remap waits for a GPU reset (NVML remapped rows); null: unknown
    power_cap_w: float | None = None  # the power limit gpuevents set (power_cap); null: none
    power_cap_saved_w: float | None = None  # the draw before the cap less the draw now, while capped


class GpuXid(GpuInfo):
    """A GPU that reported an XID error."""

    xid: int


class ProcessInfo(_Model):
    """A process that holds a GPU; identified by `pid` and `create_time` together."""

    node: str
    pid: int
    name: str = ""
    """The name the process gives itself (`/proc/<pid>/comm`): shown, never trusted."""
    exe: str = ""
    """Its program, `/proc/<pid>/exe` (empty: unknown); what `protect.process_patterns` match."""
    cmdline: str = ""
    user: str | None = None
    uid: int | None = None
    owner: str | None = None
    create_time: datetime
    age_s: float | None = Field(None, ge=0, le=MAX_AGE_S)
    ppid: int | None = None
    job: str | None = None
    """The scheduler job it runs in (the Slurm job id), from its cgroup or its environment (`SLURM_JOB_ID`)."""
    service: str | None = None
    """The system unit that runs it (`nvidia-dcgm.service`, `slurmstepd.scope`, `slurm`), from its cgroup."""
    gpus: list[int] = Field(default_factory=list)
    gpu_mem_mib: float | None = None
    gpu_util_pct: float | None = None
    container_id: str | None = None
    pod_uid: str | None = None
    pod: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class JobInfo(_Model):
    """A scheduler job (or pod) holding GPUs on this node: what the scheduler says of it, and which of this node's
    GPUs and processes are its. The engine joins a job's parts across nodes into one `job` entity."""

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
    gpus: list[int] = Field(default_factory=list)
    pids: list[int] = Field(default_factory=list)
    started_at: datetime | None = None
    time_limit_s: float | None = Field(None, ge=0)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    """Kubernetes: the top owner's annotations under its pod's, and its namespace's `gpuevents.io/` ones."""
    pods: list[str] = Field(default_factory=list)
    """Kubernetes: the names of its pods on this node."""
    controller_uid: str | None = None
    """Kubernetes: the uid of the top owner (`controller`), so an action can tell it is still the same object."""
    controller_generation: int | None = None
    """Kubernetes: its metadata.generation when the agent last read it."""


class NodeSnapshot(_Model):
    """The whole node at one instant."""

    node: NodeInfo
    jobs: list[JobInfo] = Field(default_factory=list)
    gpus: list[GpuInfo] = Field(default_factory=list)
    processes: list[ProcessInfo] = Field(default_factory=list)


class AgentInfo(_Model):
    node: str
    version: str = ""
    sampler: str = ""
    hostname: str | None = None
    pid: int | None = None
    agent_id: str | None = None
    sample_interval_s: float | None = None
    snapshot_interval_s: float | None = None


class DemandEntry(_Model):
    """GPUs waiting to be allocated in one partition (Slurm), node pool (Kubernetes) or GPU model."""

    partition: str | None = None
    pool: str | None = None
    model: str | None = None
    pending_gpus: int = Field(ge=0)
    waiting_since: datetime | None = None
    """When the oldest of them started waiting (its submission); `demand.waiting_for_s` counts from it."""


class DemandReport(_Model):
    """What one scheduler of a cluster has waiting now; it replaces that scheduler's previous report whole."""

    scheduler: Literal["slurm", "kubernetes"]
    entries: list[DemandEntry] = Field(default_factory=list, max_length=10_000)
    valid_for_s: float | None = Field(None, gt=0, le=MAX_AGE_S)
    """How long the report holds without a newer one (a reader sets a few of its intervals, so that a reader
    that stopped stops counting); None: until the next report."""


def _dump(s: msgspec.Struct, info: SerializationInfo) -> object:
    return msgspec.to_builtins(s) if info.mode_is_json() else msgspec.to_builtins(s, builtin_types=(datetime,))


def _agent_data(model: type[_Model], struct: type[msgspec.Struct]) -> object:
    """An agent event's `data`: the Struct the engine keeps (gpuevents/agentdata.py). What is not one yet (JSON
    the pydantic path reads, a model someone wrote) is validated by `model`, as it always was, then made one."""

    def to_struct(v: object) -> object:
        if isinstance(v, struct):
            return v
        return A.struct_of(model.model_validate(v).model_dump(), struct)

    return Annotated[struct, BeforeValidator(to_struct), PlainSerializer(_dump)]


class _Envelope(_Model):
    model_config = ConfigDict(extra="ignore", frozen=True, arbitrary_types_allowed=True)

    specversion: Literal["1.0"] = "1.0"
    id: str = Field(default_factory=new_id)
    source: str
    cluster: str = "default"
    time: datetime

    @property
    def node(self) -> str:
        """The node name from `source` (`node/<name>`)."""
        return self.source.removeprefix("node/")


if TYPE_CHECKING:
    SnapshotData = A.NodeSnapshot
    GpuData = A.GpuInfo
    GpuXidData = A.GpuXid
    ProcessData = A.ProcessInfo
    AgentData = A.AgentInfo
else:
    SnapshotData = _agent_data(NodeSnapshot, A.NodeSnapshot)
    GpuData = _agent_data(GpuInfo, A.GpuInfo)
    GpuXidData = _agent_data(GpuXid, A.GpuXid)
    ProcessData = _agent_data(ProcessInfo, A.ProcessInfo)
    AgentData = _agent_data(AgentInfo, A.AgentInfo)


class SnapshotEvent(_Envelope):
    type: Literal["node.snapshot"] = "node.snapshot"
    data: SnapshotData


class GpuEvent(_Envelope):
    type: GpuEventType
    data: GpuData


class GpuXidEvent(_Envelope):
    type: Literal["gpu.xid"] = "gpu.xid"
    data: GpuXidData


class ProcessEvent(_Envelope):
    type: ProcessEventType
    data: ProcessData


class AgentEvent(_Envelope):
    type: AgentEventType
    data: AgentData


class JobEnded(_Model):
    """A job that has ended, with its summary (as the usage store keeps it): the occasion for `job.ended_at`."""

    id: str
    scheduler: Literal["slurm", "kubernetes"] = "slurm"
    user: str | None = None
    name: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    namespace: str | None = None
    nodes: list[str] = Field(default_factory=list)
    model: str | None = None
    gpu_count: int = 0
    started_at: datetime | None = None
    ended_at: datetime
    hours: float = 0.0
    gpu_hours: float = 0.0
    mean_util_pct: float | None = None
    peak_util_pct: float | None = None
    mean_sm_active_pct: float | None = None
    peak_mem_mib: float | None = None
    p95_util_pct: float | None = None
    p95_sm_active_pct: float | None = None
    p95_mem_mib: float | None = None
    """The 95th percentiles over the job's GPU-time (never under the truth, never over the peak)."""
    idle_share_pct: float | None = None
    cost: float = 0.0
    cost_text: str = ""
    """`cost` in the configured currency (`$41.00`)."""
    smaller_fit: str | None = None


class JobEndedEvent(_Envelope):
    type: Literal["job.ended"] = "job.ended"
    data: JobEnded


class DemandEvent(_Envelope):
    """A scheduler's waiting GPUs, published by the one demand reader under the reserved node token
    `SCHEDULER_SOURCE` (no agent can publish there: its NATS user is fenced to its own node's subjects)."""

    type: Literal["scheduler.demand"] = "scheduler.demand"
    data: DemandReport


SCHEDULER_SOURCE = "@scheduler"
"""The node name that the engine's scheduler-side events carry (`scheduler.demand`, `job.ended`:
`node/@scheduler`): not a host name, so no agent is called so, and the engine believes them from nowhere else."""


Event = Annotated[
    SnapshotEvent | GpuEvent | GpuXidEvent | ProcessEvent | AgentEvent | DemandEvent | JobEndedEvent,
    Field(discriminator="type"),
]
_EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def decode_event(raw: bytes | str) -> Event:
    """Parse one event from JSON; raises pydantic.ValidationError on a malformed one."""
    return _EVENT_ADAPTER.validate_json(raw)


def event_from_obj(obj: object) -> Event:
    """Validate an already-decoded JSON object as an event."""
    return _EVENT_ADAPTER.validate_python(obj)


def encode_event(event: Event) -> bytes:
    return event.model_dump_json(exclude_none=False).encode()


@overload
def make_event(type_: Literal["node.snapshot"], node: str, data: NodeSnapshot | A.NodeSnapshot, *,
               cluster: str = "default", time: datetime | None = None, id: str | None = None) -> SnapshotEvent: ...


@overload
def make_event(type_: str, node: str, data: BaseModel | msgspec.Struct, *, cluster: str = "default",
               time: datetime | None = None, id: str | None = None) -> Event: ...


def make_event(
    type_: str,
    node: str,
    data: BaseModel | msgspec.Struct,
    *,
    cluster: str = "default",
    time: datetime | None = None,
    id: str | None = None,
) -> Event:
    """Build an envelope around `data` for `node` (a snapshot's is a SnapshotEvent: its type says so)."""
    t = time or datetime.now(UTC)
    obj: dict[str, object] = {
        "type": type_,
        "source": f"node/{node}",
        "cluster": cluster,
        "time": t,
        "data": data,
    }
    if id is not None:
        obj["id"] = id
    else:
        obj["id"] = new_id(int(t.timestamp() * 1000))
    return _EVENT_ADAPTER.validate_python(obj)


def dumps(obj: object) -> bytes:
    """orjson with the options used everywhere on the wire."""
    return orjson.dumps(obj, option=orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC)
