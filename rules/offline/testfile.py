"""Rule test files (DESIGN §4): their model, loading with located errors, and snapshots as core inputs."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpuevents.clock import utc
from gpuevents.config import Config, ThresholdsConfig
from gpuevents.costs import CostModel
from gpuevents.durations import Duration
from gpuevents.events import (
    SCHEDULER_SOURCE,
    DemandEntry,
    DemandEvent,
    DemandReport,
    GpuInfo,
    JobInfo,
    NodeInfo,
    NodeSnapshot,
    ProcessInfo,
    SnapshotEvent,
)
from gpuevents.yamlpos import LocatedError, parse_yaml, read_yaml_text
from rules.core.core import CoreInput, ForgetNode
from rules.lang import calendars
from rules.usage.jobledger import JobLedger
from rules.usage.jobstore import ended_event, summary_of

DEFAULT_START = "2026-01-05T00:00:00"
DEFAULT_MEM_TOTAL_MIB = 81559.0
CONFIG_SECTIONS = frozenset({"engine", "protect", "owners", "costs", "agent", "actions", "cluster"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TestGpu(_Strict):
    index: int
    util_pct: float = 0
    mem_used_mib: float = 0
    mem_total_mib: float = DEFAULT_MEM_TOTAL_MIB
    idle: bool | None = None
    idle_for: Duration | None = Field(None, description="idle since `at - idle_for` (extension)")
    activity_known: bool = Field(True, description="false: held with no activity signal (a MIG instance "
                                 "without GPM or dcgm-exporter); then it is never idle")
    uuid: str = ""
    model: str | None = None
    mem_pct: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    fan_pct: float | None = None
    ecc_uncorrected: int | None = None
    mig_parent: str | None = None
    lost: bool = False
    xid: int | None = Field(None, description="the last XID the GPU reported (kept across snapshots)")
    xid_at: Duration | None = Field(None, description="when that XID came (its `gpu.xid` event), from the test's "
                                    "start; default: the first snapshot showing it")
    pids: list[int] = Field(default_factory=list)
    sm_active_pct: float | None = None
    tensor_active_pct: float | None = None
    row_remap_pending: bool | None = None
    power_cap_w: float | None = Field(None, description="the power limit gpuevents set (power_cap)")
    power_cap_saved_w: float | None = Field(None, description="the draw the cap saves, while capped")


class TestProcess(_Strict):
    pid: int
    user: str | None = None
    gpus: list[int] = Field(default_factory=list)
    age: Duration | None = None
    create_time: datetime | None = None
    name: str = ""
    exe: str = ""
    cmdline: str = ""
    uid: int | None = None
    owner: str | None = None
    ppid: int | None = None
    service: str | None = None
    job: str | None = None
    gpu_mem_mib: float | None = None
    gpu_util_pct: float | None = None
    container_id: str | None = None
    pod: str | None = None
    pod_uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class TestJob(_Strict):
    """A scheduler job on the snapshot's node: the GPUs listed are allocated to it, the processes listed run in
    it; its entity is `job/<scheduler>/<id>` (DESIGN §4). A Kubernetes job is given as its pod: `{scheduler:
    kubernetes, namespace, pod, controller: Kind/name (absent for a bare pod), ...}`; its id is
    `<namespace>/<Kind>/<name>` of the controller (`<namespace>/Pod/<pod>` for a bare pod)."""

    id: str = ""
    scheduler: Literal["slurm", "kubernetes"] = "slurm"
    pod: str | None = None
    annotations: dict[str, str] = Field(default_factory=dict)
    user: str | None = None
    name: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    namespace: str | None = None
    controller: str | None = None
    gpus: list[int] = Field(default_factory=list)
    pids: list[int] = Field(default_factory=list)
    age: Duration | None = None
    time_limit: Duration | None = None
    labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _kubernetes_id(self) -> TestJob:
        if self.scheduler == "slurm":
            if not self.id:
                raise ValueError("a Slurm job needs `id`")
            if self.pod or self.annotations:
                raise ValueError("`pod` and `annotations` are for `scheduler: kubernetes` jobs")
            return self
        if self.controller is not None:
            kind, _, name = self.controller.partition("/")
            if not kind or not name or "/" in name:
                raise ValueError(f"controller {self.controller!r} is not Kind/name (e.g. Deployment/llm-serve)")
        if self.id:
            return self
        if not self.namespace or not self.pod:
            raise ValueError("a Kubernetes job needs `namespace` and `pod` (and `controller: Kind/name` unless "
                             "the pod has no owner), or `id`")
        top = self.controller or f"Pod/{self.pod}"
        object.__setattr__(self, "id", f"{self.namespace}/{top}")  # frozen: set once, while validating
        return self


class TestDiag(_Strict):
    """The site's diagnostic as a node's agent reports it (`node.diag_*`): the latest run's status, and when the
    latest passing and failing runs ended (offsets from the test's start)."""

    status: Literal["running", "passed", "failed"]
    passed_at: Duration | None = None
    failed_at: Duration | None = None
    started_at: Duration | None = None
    exit_code: int | None = None
    output: str | None = None

    def fields(self, start: datetime) -> dict[str, Any]:
        def t(v: float | None) -> datetime | None:
            return start + timedelta(seconds=v) if v is not None else None
        return {"diag_status": self.status, "diag_passed_at": t(self.passed_at), "diag_failed_at": t(self.failed_at),
                "diag_started_at": t(self.started_at), "diag_exit_code": self.exit_code, "diag_output": self.output}


class TestSnapshot(_Strict):
    at: Duration
    node: str
    cluster: str = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: list[TestGpu] = Field(default_factory=list)
    processes: list[TestProcess] = Field(default_factory=list)
    jobs: list[TestJob] = Field(default_factory=list)
    gone: bool = False
    cordoned: bool | None = None
    driver_version: str | None = None
    diag: TestDiag | None = Field(None, description="the node's latest diagnostic run, as its agent reports it")


class TestDemand(_Strict):
    """What the schedulers report as waiting from `at` on, for one partition, pool or model (DESIGN §4); it
    replaces the previous entry for the same partition / pool / model."""

    at: Duration
    cluster: str = "default"
    partition: str | None = None
    pool: str | None = None
    model: str | None = None
    pending_gpus: int = Field(ge=0)
    waiting_for: Duration = 0

    @model_validator(mode="after")
    def _one_key(self) -> TestDemand:
        if sum(x is not None for x in (self.partition, self.pool, self.model)) != 1:
            raise ValueError("a demand entry names exactly one of partition, pool or model")
        return self


OUTCOMES = ("run", "suppressed", "held", "refused", "expired")


class ExpectedAction(BaseModel):
    """An expected action: its type, optionally how it was decided (`outcome`), and rendered parameters."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str
    outcome: str = "run"

    @field_validator("outcome")
    @classmethod
    def _outcome(cls, v: str) -> str:
        if v not in OUTCOMES:
            raise ValueError(f"must be one of {', '.join(OUTCOMES)}")
        return v

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class StagedExpectation(_Strict):
    """One stage of staged actions (`after:`): when it ran and what it ran."""

    at: Duration
    actions: list[str | ExpectedAction]


class Expectation(_Strict):
    rule: str
    entity: str
    fires_at: Duration | None = None
    resolves_at: Duration | None = None
    actions: list[str | ExpectedAction] | None = None
    resolve_actions: list[str | ExpectedAction] | None = None
    staged: list[StagedExpectation] | None = None
    count: int | None = Field(None, ge=0)
    never: bool = False


class RuleTest(_Strict):
    name: str
    start: datetime | str | None = Field(None, description="overrides the file's `start` (extension)")
    snapshots: list[TestSnapshot] = Field(default_factory=list)
    expect: list[Expectation] = Field(default_factory=list)
    restarts: list[Duration] = Field(default_factory=list, description="the engine restarts at these offsets")
    demand: list[TestDemand] = Field(default_factory=list, description="GPUs waiting, from `at` on")


class TestFile(_Strict):
    rule_files: list[str] = Field(min_length=1)
    timezone: str = "UTC"
    start: datetime | str = DEFAULT_START
    tick: Duration = 30
    owners: dict[str, str] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict, description="configuration sections for the run")
    tests: list[RuleTest] = Field(min_length=1)

    def run_config(self) -> Config:
        """The configuration of the run: `config:` over the file's timezone, tick and owners."""
        data: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in self.config.items()}
        engine = data.setdefault("engine", {})
        engine.setdefault("timezone", self.timezone)
        engine.setdefault("tick", self.tick)
        data["owners"] = {**self.owners, **data.get("owners", {})}
        return Config.model_validate(data)

    @field_validator("tick")
    @classmethod
    def _tick(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be longer than 0s")
        return v


def load_test_file(path: Path) -> TestFile:
    """Parse and validate a test file; LocatedError on any problem."""
    doc = parse_yaml(read_yaml_text(path, "rule test file"), str(path))
    if not isinstance(doc.data, dict):
        raise LocatedError([doc.locate((), "a rule test file is a mapping with rule_files and tests")])
    try:
        tf = TestFile.model_validate(doc.data)
    except ValidationError as e:
        raise LocatedError(doc.validation_problems(e)) from None
    try:
        calendars.zone(tf.timezone)
    except calendars.CalendarError as e:
        raise LocatedError([doc.locate(("timezone",), f"timezone: {e}")]) from None
    unknown = sorted(set(tf.config) - CONFIG_SECTIONS)
    if unknown:
        raise LocatedError([doc.locate(("config", unknown[0]), f"config.{unknown[0]}: rule tests take the sections "
                                       f"{', '.join(sorted(CONFIG_SECTIONS))}")])
    try:
        tf.run_config()
    except ValidationError as e:
        raise LocatedError([doc.locate(("config", *err["loc"]), "config." + ".".join(map(str, err["loc"]))
                                       + f": {err['msg']}") for err in e.errors()]) from None
    return tf


def start_of(tf: TestFile, test: RuleTest) -> datetime:
    tz = calendars.zone(tf.timezone)
    raw = test.start if test.start is not None else tf.start
    start = raw if isinstance(raw, datetime) else datetime.fromisoformat(str(raw))
    aware = start.replace(tzinfo=tz) if start.tzinfo is None else start
    return utc(aware)  # offsets are elapsed time: add them in UTC, not on the local wall clock


def snapshot_inputs(test: RuleTest, start: datetime, owners: dict[str, str],
                    idle_util_pct: float = 5.0,
                    thresholds: ThresholdsConfig | None = None) -> list[tuple[datetime, CoreInput]]:
    """The snapshots of a test as core inputs: defaults filled, idle derived (by the GPU model's idle rule of
    `thresholds`, else `util_pct < idle_util_pct`), create times from `age`."""
    th = thresholds or ThresholdsConfig(idle_util_pct=idle_util_pct)
    out: list[tuple[datetime, CoreInput]] = []
    created: dict[tuple[str, int], datetime] = {}
    job_started: dict[tuple[str, str], datetime] = {}
    for snap in sorted(test.snapshots, key=lambda s: s.at):
        at = start + timedelta(seconds=snap.at)
        if snap.gone:
            out.append((at, ForgetNode(node=snap.node, cluster=snap.cluster)))
            continue
        gpus = []
        for g in snap.gpus:
            idle = g.activity_known and (g.idle if g.idle is not None else bool(
                th.idle_rule(g.model).verdict(g.util_pct, g.sm_active_pct, g.power_w)))
            fields = g.model_dump(exclude={"idle", "idle_for", "xid_at"})
            since = at - timedelta(seconds=g.idle_for) if (idle and g.idle_for is not None) else None
            xid_at = start + timedelta(seconds=g.xid_at) if g.xid_at is not None else None
            gpus.append(GpuInfo(node=snap.node, idle=idle, idle_since=since, xid_at=xid_at, **fields))
        job_of_pid = {pid: j.id for j in snap.jobs for pid in j.pids}
        pod_of_pid = {pid: f"{j.namespace}/{j.pod}" for j in snap.jobs if j.pod for pid in j.pids}
        merged: dict[tuple[str, str], JobInfo] = {}
        for j in snap.jobs:
            started = at - timedelta(seconds=j.age) if j.age is not None else job_started.get((j.scheduler, j.id), at)
            job_started[(j.scheduler, j.id)] = started
            info = JobInfo(started_at=started, time_limit_s=j.time_limit, pods=[j.pod] if j.pod else [],
                           **j.model_dump(exclude={"age", "time_limit", "pod"}))
            prev = merged.get((j.scheduler, j.id))
            if prev is not None:  # two pods of one controller on this node: one job
                info = prev.model_copy(update={
                    "gpus": sorted({*prev.gpus, *info.gpus}), "pids": sorted({*prev.pids, *info.pids}),
                    "pods": sorted({*prev.pods, *info.pods}), "annotations": {**info.annotations,
                                                                              **prev.annotations}})
            merged[(j.scheduler, j.id)] = info
        jobs = list(merged.values())
        procs = []
        for p in snap.processes:
            if p.create_time is not None:
                ct = p.create_time
            elif p.age is not None:
                ct = at - timedelta(seconds=p.age)
            else:
                ct = created.get((snap.node, p.pid), at)
            created[(snap.node, p.pid)] = ct
            fields = p.model_dump(exclude={"age", "create_time", "owner"})
            if fields.get("job") is None and p.pid in job_of_pid:
                fields["job"] = job_of_pid[p.pid]
            if fields.get("pod") is None and p.pid in pod_of_pid:
                fields["pod"] = pod_of_pid[p.pid]
            owner = p.owner or (owners.get(p.user, p.user) if p.user else None)
            procs.append(ProcessInfo(node=snap.node, create_time=ct, owner=owner, **fields))
        node = NodeInfo(name=snap.node, cluster=snap.cluster, labels=snap.labels, gpu_count=len(gpus),
                        cordoned=snap.cordoned, driver_version=snap.driver_version,
                        **(snap.diag.fields(start) if snap.diag is not None else {}))
        event = SnapshotEvent(source=f"node/{snap.node}", cluster=snap.cluster, time=at,
                              data=NodeSnapshot(node=node, gpus=gpus, processes=procs, jobs=jobs))
        out.append((at, event))
    return out + demand_inputs(test, start)


def job_end_inputs(inputs: list[tuple[datetime, CoreInput]], costs: CostModel,
                   max_gap_s: float) -> list[tuple[datetime, CoreInput]]:
    """The `job.ended` events the engine would publish for these snapshots: a job ends at the first snapshot of
    its last node that no longer lists it (its summary counted as the usage store counts it)."""
    ledger = JobLedger(max_gap_s)
    out: list[tuple[datetime, CoreInput]] = []
    for at, item in sorted(inputs, key=lambda x: x[0]):
        if isinstance(item, SnapshotEvent):
            ledger.observe(item)
            out += [(at, ended_event(summary_of(t, costs), costs)) for t in ledger.drain(at) if t.ended_at is not None]
    return out


def demand_inputs(test: RuleTest, start: datetime) -> list[tuple[datetime, CoreInput]]:
    """The test's `demand:` as the reports a demand reader would publish: at each entry's `at`, every entry
    known by then for its cluster, the latest per partition / pool / model."""
    out: list[tuple[datetime, CoreInput]] = []
    current: dict[str, dict[tuple[str | None, str | None, str | None], DemandEntry]] = {}
    for d in sorted(test.demand, key=lambda d: d.at):
        at = start + timedelta(seconds=d.at)
        book = current.setdefault(d.cluster, {})
        book[(d.partition, d.pool, d.model)] = DemandEntry(
            partition=d.partition, pool=d.pool, model=d.model, pending_gpus=d.pending_gpus,
            waiting_since=at - timedelta(seconds=d.waiting_for) if d.pending_gpus else None)
        report = DemandReport(scheduler="slurm", entries=list(book.values()))
        out.append((at, DemandEvent(source=f"node/{SCHEDULER_SOURCE}", cluster=d.cluster, time=at, data=report)))
    return out
