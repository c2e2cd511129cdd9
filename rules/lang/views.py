"""What conditions and templates see: light views of nodes, GPUs and processes, with time-derived fields."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Protocol

from gpuevents.demand import POOL_LABELS
from gpuevents.holding import held_idle

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Moment(datetime):
    """`now` in conditions and templates: an aware datetime from which a number of seconds can be taken or to
    which it can be added (`now - duration('1d')`), as a platform engineer would write it."""

    __slots__ = ()

    @classmethod
    def of(cls, d: datetime) -> Moment:
        return cls(d.year, d.month, d.day, d.hour, d.minute, d.second, d.microsecond, d.tzinfo, fold=d.fold)

    def __add__(self, other: Any) -> Any:
        if type(other) in (int, float):
            return Moment.of(datetime.__add__(self, timedelta(seconds=other)))
        result = datetime.__add__(self, other)
        return Moment.of(result) if isinstance(result, datetime) else result

    __radd__ = __add__

    def __sub__(self, other: Any) -> Any:
        if type(other) in (int, float):
            return Moment.of(datetime.__sub__(self, timedelta(seconds=other)))
        result = datetime.__sub__(self, other)
        return Moment.of(result) if isinstance(result, datetime) else result


class EvalClock:
    """The evaluation instant, shared by every view and compiled condition of one core."""

    __slots__ = ("_local", "ts", "utc")

    def __init__(self, now: datetime = EPOCH) -> None:
        self.set(now)

    def set(self, now: datetime) -> None:
        self.utc = now
        self.ts = now.timestamp()
        self._local: dict[tzinfo, datetime] = {}

    def local(self, tz: tzinfo) -> datetime:
        """`now` in `tz`, computed once per instant and zone."""
        d = self._local.get(tz)
        if d is None:
            d = self._local[tz] = Moment.of(self.utc.astimezone(tz))
        return d


class EntityView:
    """`entity` in conditions: the evaluated entity's `id` and `kind`."""

    __slots__ = ("cluster", "id", "kind", "node")

    def __init__(self, id: str, kind: str, node: str, cluster: str) -> None:
        self.id = id
        self.kind = kind
        self.node = node
        self.cluster = cluster

    def __repr__(self) -> str:
        return f"<{self.kind} {self.id}>"


class NodeView:
    """`node`: as the agent last described it, plus `online` and `last_seen` from the engine."""

    __slots__ = (
        "cluster", "cordoned", "diag_exit_code", "diag_failed_at", "diag_output", "diag_passed_at",
        "diag_started_at", "diag_status", "driver_version", "gpu_count", "gpus_busy", "gpus_idle", "hostname",
        "id", "labels", "last_seen", "name", "online",
    )
    cluster: str
    cordoned: bool | None
    diag_exit_code: int | None
    diag_failed_at: datetime | None
    diag_output: str | None
    diag_passed_at: datetime | None
    diag_started_at: datetime | None
    diag_status: str | None
    driver_version: str | None
    gpu_count: int
    gpus_busy: int
    gpus_idle: int
    hostname: str | None
    id: str
    labels: dict[str, str]
    last_seen: datetime | None
    name: str
    online: bool

    def __init__(self, **fields: Any) -> None:
        for k in self.__slots__:
            setattr(self, k, fields.get(k))

    def __repr__(self) -> str:
        return f"<node {self.id}>"


class GpuView:
    """`gpu`: the GPU's fields, its `processes` and `owners`, and `idle_for_s` measured at evaluation time."""

    __slots__ = (
        "_clock", "_idle_since_ts", "_parted", "activity_known", "allocated", "ecc_uncorrected", "fan_pct", "id",
        "idle", "idle_since", "index", "job", "lost", "mem_pct", "mem_total_mib", "mem_used_mib", "mig_parent",
        "model", "node", "owner", "owners", "pids", "power_cap_saved_w", "power_cap_w", "power_limit_w", "power_w",
        "processes", "row_remap_pending", "sm_active_pct", "temp_c",
        "tensor_active_pct", "util_pct", "uuid", "xid", "xid_at",
    )
    activity_known: bool
    allocated: bool | None
    job: str | None
    ecc_uncorrected: int | None
    fan_pct: float | None
    id: str
    idle: bool
    idle_since: datetime | None
    index: int
    lost: bool
    mem_pct: float | None
    mem_total_mib: float | None
    mem_used_mib: float | None
    mig_parent: str | None
    model: str | None
    node: str
    owner: str | None
    owners: list[str]
    pids: list[int]
    power_cap_saved_w: float | None
    power_cap_w: float | None
    power_limit_w: float | None
    power_w: float | None
    processes: list[ProcessView]
    row_remap_pending: bool | None
    sm_active_pct: float | None
    temp_c: float | None
    tensor_active_pct: float | None
    util_pct: float | None
    uuid: str
    xid: int | None
    xid_at: datetime | None

    def __init__(self, clock: EvalClock, **fields: Any) -> None:
        self._clock = clock
        for k in _GPU_PUBLIC:
            setattr(self, k, fields.get(k))
        since = self.idle_since
        self._idle_since_ts: float | None = since.timestamp() if since is not None else None
        self._parted = False  # a MIG parent whose instances are reported (set by the state that knows its node)

    @property
    def idle_for_s(self) -> float:
        """Seconds idle so far; 0 while in use."""
        if not self.idle or self._idle_since_ts is None:
            return 0.0
        return max(0.0, self._clock.ts - self._idle_since_ts)

    @property
    def held_idle(self) -> bool:
        """Idle while a process, an owner or a scheduler's allocation holds it (gpuevents/holding.py)."""
        return held_idle(self, parted=self._parted)

    def __repr__(self) -> str:
        return f"<gpu {self.id}>"


class ProcessView:
    """`process`: a process holding a GPU, with `age_s` measured at evaluation time."""

    __slots__ = (
        "_clock", "_create_ts", "cmdline", "container_id", "create_time", "exe", "gpu_mem_mib", "gpu_util_pct",
        "gpus", "id", "job", "labels", "name", "node", "owner", "pid", "pod", "pod_uid", "ppid", "service", "uid",
        "user",
    )
    cmdline: str
    container_id: str | None
    create_time: datetime
    exe: str
    gpu_mem_mib: float | None
    gpu_util_pct: float | None
    gpus: list[int]
    id: str
    job: str | None
    labels: dict[str, str]
    name: str
    node: str
    owner: str | None
    pid: int
    pod: str | None
    pod_uid: str | None
    ppid: int | None
    service: str | None
    uid: int | None
    user: str | None

    def __init__(self, clock: EvalClock, **fields: Any) -> None:
        self._clock = clock
        for k in _PROCESS_PUBLIC:
            setattr(self, k, fields.get(k))
        self._create_ts: float = self.create_time.timestamp()

    @property
    def age_s(self) -> float:
        return max(0.0, self._clock.ts - self._create_ts)

    def __repr__(self) -> str:
        return f"<process {self.id}>"


_GPU_PUBLIC = tuple(k for k in GpuView.__slots__ if not k.startswith("_"))
_PROCESS_PUBLIC = tuple(k for k in ProcessView.__slots__ if not k.startswith("_"))


class JobView:
    """`job`: a scheduler job (or pod) holding GPUs, across its nodes; `idle_for_s` and `age_s` at evaluation time.

    `idle`: every one of its GPUs is idle; `idle_since`: since when all of them are (the latest GPU's)."""

    __slots__ = (
        "_clock", "_idle_since_ts", "_started_ts", "account", "annotations", "controller", "controller_generation",
        "controller_uid", "ended_at", "exempt_until", "exemption", "exemptions_malformed", "gpu_count", "gpus", "id",
        "idle", "idle_since", "labels", "name", "namespace", "nodes", "owner", "partition", "pods", "qos",
        "scheduler", "started_at", "summary", "time_limit_s", "user", "util_pct",
    )
    account: str | None
    annotations: dict[str, str]
    controller: str | None
    controller_generation: int | None
    controller_uid: str | None
    ended_at: datetime | None
    """Set once, on the `job.ended` event that closes the job (with `summary`); None while it runs."""
    exempt_until: datetime | None
    """The end of its exemption from every rule (gpuevents.io/keep-until or exclude annotations), or None."""
    exemption: str | None
    exemptions_malformed: list[str]
    gpu_count: int
    gpus: list[GpuView]
    id: str
    idle: bool
    idle_since: datetime | None
    labels: dict[str, str]
    name: str | None
    namespace: str | None
    nodes: list[str]
    owner: str | None
    partition: str | None
    pods: list[str]
    qos: str | None
    scheduler: str
    started_at: datetime | None
    summary: dict[str, Any] | None
    """An ended job's summary (`gpu_hours`, `hours`, `mean_util_pct`, `peak_util_pct`, `mean_sm_active_pct`,
    `peak_mem_mib`, `p95_util_pct`, `p95_sm_active_pct`, `p95_mem_mib`, `idle_share_pct`, `cost`, `smaller_fit`);
    None while it runs."""
    time_limit_s: float | None
    user: str | None
    util_pct: float | None

    def __init__(self, clock: EvalClock, **fields: Any) -> None:
        self._clock = clock
        for k in _JOB_PUBLIC:
            setattr(self, k, fields.get(k))
        self._idle_since_ts: float | None = self.idle_since.timestamp() if self.idle_since is not None else None
        self._started_ts: float | None = self.started_at.timestamp() if self.started_at is not None else None

    @property
    def idle_for_s(self) -> float:
        if not self.idle or self._idle_since_ts is None:
            return 0.0
        return max(0.0, self._clock.ts - self._idle_since_ts)

    @property
    def age_s(self) -> float | None:
        return None if self._started_ts is None else max(0.0, self._clock.ts - self._started_ts)

    def __repr__(self) -> str:
        return f"<job {self.id}>"


_JOB_PUBLIC = tuple(k for k in JobView.__slots__ if not k.startswith("_"))


class DemandSource(Protocol):
    """The engine's book of the schedulers' latest demand reports (rules/core/state/demand.py)."""

    version: int
    """Changes with every report taken in."""

    def lookup(self, cluster: str, partition: str | None, pool: str | None,
               model: str | None) -> tuple[int, float | None, int]:
        """(GPUs waiting there, since when (a timestamp), GPUs waiting in the whole cluster)."""
        ...


class DemandView:
    """`demand`: GPUs waiting to be allocated where this entity's GPUs could serve them: its partition (a job's
    own; a node's label `partition`), else its node pool (a node label such as `pool`), else its GPU model.
    `waiting_for_s` is how long the oldest of them has waited, at evaluation time (0 when none waits)."""

    __slots__ = ("_at", "_book", "_clock", "_ctx", "_job_where", "_labels", "_read_at", "cluster")

    def __init__(self, clock: EvalClock, book: DemandSource, cluster: str, ctx: dict[str, Any],
                 labels: dict[str, str] | None = None) -> None:
        self._clock = clock
        self._book = book
        self._ctx = ctx
        self._labels = labels  # a job's: its first node's labels (a job's scope has no `node`)
        self.cluster = cluster
        self._at: tuple[float, int] = (-1.0, -1)  # (instant, book version) `_read_at` was read at
        self._read_at: tuple[int, float | None, int] = (0, None, 0)
        self._job_where: tuple[str | None, str | None, str | None] | None = None
        """A job's keys, found once: its view is built anew (with a new `demand`) whenever it changes."""

    def _where(self) -> tuple[str | None, str | None, str | None]:
        if self._job_where is not None:
            return self._job_where
        ctx = self._ctx
        job, gpu, node = ctx.get("job"), ctx.get("gpu"), ctx.get("node")
        gpus = ctx.get("gpus") or (job.gpus if job is not None else [])
        labels: dict[str, str] = node.labels if node is not None else (self._labels or {})
        partition = job.partition if job is not None else labels.get("partition")
        pool = next((labels[k] for k in POOL_LABELS if labels.get(k)), None) if labels else None
        model = gpu.model if gpu is not None else next((g.model for g in gpus if g.model), None)
        if job is not None:
            self._job_where = (partition, pool, model)
        return partition, pool, model

    def _read(self) -> tuple[int, float | None, int]:
        at = (self._clock.ts, self._book.version)
        if self._at != at:  # a condition reads `demand` once per instant and report
            self._read_at = self._book.lookup(self.cluster, *self._where())
            self._at = at
        return self._read_at

    @property
    def pending_gpus(self) -> int:
        return self._read()[0]

    @property
    def waiting_for_s(self) -> float:
        since = self._read()[1]
        return 0.0 if since is None else max(0.0, self._clock.ts - since)

    @property
    def cluster_pending_gpus(self) -> int:
        return self._read()[2]

    @property
    def partition(self) -> str | None:
        return self._where()[0]

    @property
    def pool(self) -> str | None:
        return self._where()[1]

    @property
    def model(self) -> str | None:
        return self._where()[2]

    def __repr__(self) -> str:
        return f"<demand {self.pending_gpus} GPU(s) waiting>"


def _public(cls: type, extra: tuple[str, ...] = ()) -> frozenset[str]:
    return frozenset(k for k in cls.__slots__ if not k.startswith("_")) | frozenset(extra)  # type: ignore[attr-defined]  # cls is a slotted view class


NODE_FIELDS = _public(NodeView)
GPU_FIELDS = _public(GpuView, ("idle_for_s", "held_idle"))
PROCESS_FIELDS = _public(ProcessView, ("age_s",))
ENTITY_FIELDS = _public(EntityView)
JOB_FIELDS = _public(JobView, ("idle_for_s", "age_s"))
DEMAND_FIELDS = frozenset({"pending_gpus", "waiting_for_s", "cluster_pending_gpus", "partition", "pool", "model",
                           "cluster"})
FIELDS_OF: dict[str, frozenset[str]] = {
    "node": NODE_FIELDS,
    "gpu": GPU_FIELDS,
    "process": PROCESS_FIELDS,
    "job": JOB_FIELDS,
    "entity": ENTITY_FIELDS,
    "demand": DEMAND_FIELDS,
}
DERIVED_READS: dict[str, frozenset[str]] = {"held_idle": frozenset(
    {"idle", "lost", "pids", "owners", "allocated"})}
"""The fields a derived field is computed from: a condition reading it reads them (`held_idle` also changes
on its own when the GPU's MIG instances come or go)."""
TIME_FIELDS = frozenset({"idle_for_s", "age_s", "pending_gpus", "cluster_pending_gpus"})
"""Fields whose value moves with the clock (or, for demand, with reports that are no entity's event): a
condition reading one is re-evaluated on every tick."""
