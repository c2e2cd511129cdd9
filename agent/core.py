"""The agent's pure core: one sample in, edge-threshold and process events out; time is an argument."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from agent.inputs import NodeInputs
from agent.jobdetails import JobDetails
from agent.podalloc import PodAllocation, pods_by_gpu
from agent.sample import GpuReading, NodeReading, ProcessIdentity
from gpuevents.config import ThresholdsConfig
from gpuevents.events import (
    Event,
    GpuInfo,
    GpuXid,
    JobInfo,
    NodeInfo,
    NodeSnapshot,
    ProcessInfo,
    make_event,
)
from gpuevents.idleness import IdleRule

#: memory-full re-arms only once usage falls this many points below the threshold
MEM_FULL_REARM_PCT = 5.0


@dataclass(frozen=True, slots=True)
class GpuState:
    """Edge-threshold state of one GPU, as timestamps and flags."""

    idle: bool = False
    idle_since: datetime | None = None
    active_streak: int = 0
    hot: bool = False
    mem_full: bool = False
    lost: bool = False
    activity_known: bool = True


def step_gpu(
    state: GpuState, r: GpuReading, now: datetime, th: ThresholdsConfig, rule: IdleRule | None = None,
    held: bool = True,
) -> tuple[GpuState, tuple[str, ...]]:
    """Apply one reading; returns the new state and the threshold events crossed (in order).

    Idle starts on the first idle sample by `rule` (default: the GPU model's `th.idle_rule`, utilization
    under `idle_util_pct` unless `idle_by_model` says otherwise); it ends only after `active_samples`
    consecutive busy samples, so a blip does not reset the idle clock. A reading without the rule's signal
    (unsupported, no GPM, no power reading) is no evidence either way and leaves idleness as it was.

    A MIG instance has a signal only through GPM (Hopper) or dcgm-exporter's profiling: without one, an
    instance no process holds (`held` False) is free, hence idle; one that is held is unknown (not idle, and
    `activity_known` False), never taken for busy.
    """
    if r.lost:
        if state.lost:
            return state, ()
        return GpuState(lost=True), ("gpu.lost",)
    events: list[str] = []
    idle, since, streak = state.idle, state.idle_since, state.active_streak
    verdict = (rule or th.idle_rule(r.model)).verdict(r.util_pct, r.sm_active_pct, r.power_w)
    known = True
    if verdict is None and r.mig_parent is not None:
        if held:
            idle, since, streak, known = False, None, 0, False
        else:
            verdict = True
    if verdict is not None:
        if verdict:
            streak = 0
            if not idle:
                idle, since = True, now
                events.append("gpu.idle")
        elif idle:
            streak += 1
            if streak >= th.active_samples:
                idle, since, streak = False, None, 0
                events.append("gpu.active")
    hot = state.hot
    if r.temp_c is not None:
        if not hot and r.temp_c >= th.hot_temp_c:
            hot = True
            events.append("gpu.hot")
        elif hot and r.temp_c < th.hot_clear_c:
            hot = False
    mem_full = state.mem_full
    pct = r.mem_pct
    if pct is not None:
        if not mem_full and pct >= th.memory_full_pct:
            mem_full = True
            events.append("gpu.memory_full")
        elif mem_full and pct < th.memory_full_pct - MEM_FULL_REARM_PCT:
            mem_full = False
    new = GpuState(idle=idle, idle_since=since, active_streak=streak, hot=hot, mem_full=mem_full,
                   activity_known=known)
    return (state if new == state else new), tuple(events)


@dataclass(frozen=True, slots=True)
class HeldProcess:
    """A process holding GPUs in the latest sample: who it is and what it holds."""

    ident: ProcessIdentity
    gpus: tuple[int, ...]
    mem_mib: float | None
    util_pct: float | None


MPS_SERVER = "nvidia-cuda-mps-server"


def is_mps_server(ident: ProcessIdentity) -> bool:
    """The MPS server (its comm is cut to 15 characters: `nvidia-cuda-mps`; its program names it whole)."""
    return ident.exe.rsplit("/", 1)[-1] == MPS_SERVER or ident.name in (MPS_SERVER, MPS_SERVER[:15])


def _sum(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known), 2) if known else None


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 2) if known else None


class NodeCore:
    """Per-node state across samples; `step(now, reading, identities)` returns the events to publish."""

    def __init__(
        self,
        *,
        node: str,
        cluster: str,
        thresholds: ThresholdsConfig,
        snapshot_interval_s: float,
        labels: Mapping[str, str] | None = None,
        driver_version: str | None = None,
        hostname: str | None = None,
        agent_id: str | None = None,
    ) -> None:
        self.node = node
        self.agent_id = agent_id
        self.cluster = cluster
        self.thresholds = thresholds
        self.snapshot_interval = timedelta(seconds=snapshot_interval_s)
        self.inputs = NodeInputs(labels=dict(labels or {}))
        """The changing inputs as of the last step (`step` takes them)."""
        self.driver_version = driver_version
        self.hostname = hostname
        self.gpu_states: dict[int, GpuState] = {}
        self.readings: dict[int, GpuReading] = {}
        self.held: dict[tuple[int, datetime], HeldProcess] = {}
        self.last_xid: dict[int, int] = {}  # GPU index -> the last XID it reported (dcgm's XID_ERRORS)
        self._idle_rules: dict[str | None, IdleRule] = {}
        self.last_snapshot_at: datetime | None = None
        self.now: datetime | None = None
        self._kube_by_gpu: tuple[Mapping[str, PodAllocation], int, dict[int, list[str]]] | None = None
        self._carried_idle: dict[str, datetime] = {}  # idle clocks from before a restart, by GPU uuid

    # ------------------------------------------------------------ stepping
    def carry_idle(self, clocks: Mapping[str, datetime]) -> None:
        """Idle clocks from before a restart (GPU uuid → idle_since), each taken by its GPU's first sample."""
        self._carried_idle = dict(clocks)

    def step(
        self, now: datetime, reading: NodeReading, identities: Mapping[int, ProcessIdentity],
        inputs: NodeInputs | None = None,
    ) -> list[Event]:
        """Fold one sample, with the changing `inputs` as of it (None: those of the last step), into the state;
        the events it causes, snapshot included when due."""
        self.now = now
        if inputs is not None:
            self.inputs = inputs
        held = self._group(reading, identities)
        held_gpus = {g for h in held.values() for g in h.gpus}
        gpu_events: list[tuple[str, int]] = []
        for r in reading.gpus:
            old = self.gpu_states.get(r.index)
            if old is None:
                since = self._carried_idle.pop(r.uuid, None) if r.uuid else None
                still_idle = r.util_pct is not None and r.util_pct < self.thresholds.idle_util_pct
                old = GpuState(idle=True, idle_since=since) if since is not None and still_idle else GpuState()
            new, crossed = step_gpu(old, r, now, self.thresholds, self.idle_rule(r.model),
                                    held=r.index in held_gpus)
            self.gpu_states[r.index] = new
            self.readings[r.index] = r
            gpu_events.extend((t, r.index) for t in crossed)

        started = [k for k in held if k not in self.held]
        ended = [self.held[k] for k in self.held if k not in held]
        self.held = held

        events: list[Event] = []
        for k in started:
            events.append(self._event("process.started", self.process_info(held[k], now), now))
        for type_, index in gpu_events:
            events.append(self._event(type_, self.gpu_info(index, now), now))
        for x in reading.xids:
            self.last_xid[x.gpu] = x.xid
            base = self.gpu_info(x.gpu, now) if x.gpu in self.readings else GpuInfo(node=self.node, index=x.gpu)
            data = GpuXid(**{**base.model_dump(), "xid": x.xid, "xid_at": now})
            events.append(self._event("gpu.xid", data, now))
        for p in ended:
            events.append(self._event("process.ended", self.process_info(p, now), now))
        if self.last_snapshot_at is None or now - self.last_snapshot_at >= self.snapshot_interval:
            self.last_snapshot_at = now
            events.append(self._event("node.snapshot", self.snapshot(now), now))
        return events

    def idle_rule(self, model: str | None) -> IdleRule:
        """The idle rule for this model, looked up once per model."""
        rule = self._idle_rules.get(model)
        if rule is None:
            rule = self._idle_rules[model] = self.thresholds.idle_rule(model)
        return rule

    def _group(
        self, reading: NodeReading, identities: Mapping[int, ProcessIdentity]
    ) -> dict[tuple[int, datetime], HeldProcess]:
        by_pid: dict[int, list[tuple[int, float | None, float | None]]] = {}
        for p in reading.procs:
            by_pid.setdefault(p.pid, []).append((p.gpu, p.mem_mib, p.sm_util_pct))
        held: dict[tuple[int, datetime], HeldProcess] = {}
        servers = {pid for pid in by_pid if (i := identities.get(pid)) is not None and is_mps_server(i)}
        if servers:  # an MPS server holds a GPU for its clients: where they are seen, the GPU is theirs
            client_gpus = {g for pid, rows in by_pid.items() if pid not in servers for g, _, _ in rows}
            for pid in servers:
                by_pid[pid] = [row for row in by_pid[pid] if row[0] not in client_gpus]
        for pid, rows in by_pid.items():
            if not rows:
                continue
            ident = identities.get(pid)
            if ident is None:  # ended between NVML's list and psutil's look
                continue
            held[(pid, ident.create_time)] = HeldProcess(
                ident=ident,
                gpus=tuple(sorted({g for g, _, _ in rows})),
                mem_mib=_sum([m for _, m, _ in rows]),
                util_pct=_mean([u for _, _, u in rows]),
            )
        return held

    def _event(self, type_: str, data: GpuInfo | ProcessInfo | NodeSnapshot, now: datetime) -> Event:
        return make_event(type_, self.node, data, cluster=self.cluster, time=now)

    # ------------------------------------------------------------ views
    def idle_clocks(self) -> dict[str, datetime]:
        """GPU uuid → idle_since for the GPUs idle now (what an agent restart should carry over)."""
        out = {}
        for index, st in self.gpu_states.items():
            r = self.readings.get(index)
            if st.idle and st.idle_since is not None and r is not None and r.uuid:
                out[r.uuid] = st.idle_since
        return out

    def holds_gpu(self, pid: int, create_time: datetime, tolerance_s: float = 1.0) -> bool:
        """Whether the latest sample had this process (pid and create time) on a GPU."""
        for (p, ct), _ in self.held.items():
            if p == pid and abs((ct - create_time).total_seconds()) <= tolerance_s:
                return True
        return False

    def held_process(self, pid: int) -> HeldProcess | None:
        for (p, _), h in self.held.items():
            if p == pid:
                return h
        return None

    def process_info(self, h: HeldProcess, now: datetime) -> ProcessInfo:
        i = h.ident
        return ProcessInfo(
            node=self.node, pid=i.pid, name=i.name, exe=i.exe, cmdline=i.cmdline, user=i.user, uid=i.uid,
            owner=i.owner, create_time=i.create_time,
            age_s=round(max(0.0, (now - i.create_time).total_seconds()), 3), ppid=i.ppid, service=i.service,
            job=i.job or (self._kube_job_of(i.pod) if i.pod and self.inputs.kube_pods is not None
                          and i.pod in self.inputs.kube_pods else None),
            gpus=list(h.gpus), gpu_mem_mib=h.mem_mib, gpu_util_pct=h.util_pct,
            container_id=i.container_id, pod_uid=i.pod_uid, pod=i.pod, labels=dict(i.labels),
        )

    def processes_on(self, index: int) -> list[HeldProcess]:
        """Processes on GPU `index`, oldest first."""
        on = [h for h in self.held.values() if index in h.gpus]
        on.sort(key=lambda h: (h.ident.create_time, h.ident.pid))
        return on

    def gpu_info(self, index: int, now: datetime) -> GpuInfo:
        r = self.readings[index]
        st = self.gpu_states.get(index, GpuState())
        procs = self.processes_on(index)
        owners: list[str] = []
        for h in procs:
            who = h.ident.owner or h.ident.user
            if who and who not in owners:
                owners.append(who)
        return GpuInfo(
            node=self.node, index=index, uuid=r.uuid, model=r.model, util_pct=r.util_pct,
            mem_used_mib=r.mem_used_mib, mem_total_mib=r.mem_total_mib, mem_pct=r.mem_pct,
            temp_c=r.temp_c, power_w=r.power_w, power_limit_w=r.power_limit_w, fan_pct=r.fan_pct,
            ecc_uncorrected=r.ecc_uncorrected, idle=st.idle, activity_known=st.activity_known,
            idle_since=st.idle_since,
            idle_for_s=(round((now - st.idle_since).total_seconds(), 3)
                        if st.idle_since is not None else None),
            pids=[h.ident.pid for h in procs], owners=owners, owner=owners[0] if owners else None,
            mig_parent=r.mig_parent, lost=st.lost or r.lost,
            sm_active_pct=r.sm_active_pct, tensor_active_pct=r.tensor_active_pct,
            row_remap_pending=r.row_remap_pending, **self._allocation(index), **self._power_cap(index, r.power_w),
        )

    def _power_cap(self, index: int, power_w: float | None) -> dict[str, Any]:
        cap = self.inputs.power_caps(index) if self.inputs.power_caps is not None else None
        if cap is None:
            return {}
        cap_w, before = cap
        saved = None if before is None or power_w is None else round(max(0.0, before - power_w), 3)
        return {"power_cap_w": cap_w, "power_cap_saved_w": saved}

    def kube_by_gpu(self) -> dict[int, list[str]]:
        """GPU index -> the pods allocated it (computed once per PodResources answer)."""
        pods = self.inputs.kube_pods or {}
        cached = self._kube_by_gpu
        if cached is None or cached[0] is not pods or cached[1] != len(self.readings):
            cached = self._kube_by_gpu = (pods, len(self.readings), pods_by_gpu(pods, list(self.readings.values())))
        return cached[2]

    def _kube_job_of(self, pod: str) -> str:
        job = self.inputs.kube_jobs.get(pod)
        if job is not None:
            return job.id
        namespace, _, name = pod.partition("/")
        return f"{namespace}/Pod/{name}"  # not resolved (yet): the pod is its own job

    def _allocation(self, index: int) -> dict[str, Any]:
        if self.inputs.kube_pods is not None:
            pods = self.kube_by_gpu().get(index, [])
            return {"allocated": bool(pods), "job": self._kube_job_of(pods[0]) if pods else None}
        if self.inputs.job_gpus is None:
            return {}
        jobs = self.inputs.job_gpus.get(str(index), [])
        return {"allocated": bool(jobs), "job": jobs[0] if jobs else None}

    def jobs(self) -> list[JobInfo]:
        """The jobs the scheduler allocates this node's GPUs to: Slurm's (the HPC job mapping) and Kubernetes'
        (the kubelet's pods, joined by their top owner), with their processes here."""
        return self._hpc_jobs() + self._kube_jobs()

    def _kube_jobs(self) -> list[JobInfo]:
        if self.inputs.kube_pods is None:
            return []
        gpus_of: dict[str, set[int]] = {}
        pods_of: dict[str, list[str]] = {}
        for index, pods in self.kube_by_gpu().items():
            for pod in pods:
                jid = self._kube_job_of(pod)
                gpus_of.setdefault(jid, set()).add(index)
                if pod not in pods_of.setdefault(jid, []):
                    pods_of[jid].append(pod)
        out = []
        for jid in sorted(gpus_of):
            pods = sorted(pods_of[jid])
            info = next((self.inputs.kube_jobs[p] for p in pods if p in self.inputs.kube_jobs), None)
            procs = [h.ident for h in self.held.values() if h.ident.pod in pods]
            namespace = jid.split("/", 1)[0]
            out.append(JobInfo(
                id=jid, scheduler="kubernetes", name=jid.rsplit("/", 1)[-1], namespace=namespace,
                user=(info.user if info else None) or next((i.user for i in procs if i.user), None),
                owner=next((i.owner for i in procs if i.owner), None) if not (info and info.user) else None,
                controller=info.controller if info else None, gpus=sorted(gpus_of[jid]),
                pids=sorted(i.pid for i in procs), pods=[p.split("/", 1)[1] for p in pods],
                started_at=min((t for p in pods if p in self.inputs.kube_jobs
                                if (t := self.inputs.kube_jobs[p].started_at) is not None), default=None),
                labels=dict(info.labels) if info else {}, annotations=dict(info.annotations) if info else {},
                controller_uid=info.controller_uid if info else None,
                controller_generation=info.controller_generation if info else None,
            ))
        return out

    def _hpc_jobs(self) -> list[JobInfo]:
        if self.inputs.job_gpus is None:
            return []
        gpus_of: dict[str, list[int]] = {}
        for key, jobs in self.inputs.job_gpus.items():
            if key.isdigit() and int(key) in self.readings:
                for job in jobs:
                    gpus_of.setdefault(job, []).append(int(key))
        out = []
        for job, gpus in sorted(gpus_of.items()):
            procs = [h.ident for h in self.held.values() if h.ident.job == job]
            d = (self.inputs.job_details(job) if self.inputs.job_details is not None else None) or JobDetails()
            # the scheduler's word on the user first; else the user its processes here run as
            user = d.user or next((i.user for i in procs if i.user), None)
            out.append(JobInfo(id=job, user=user, gpus=sorted(gpus), pids=sorted(i.pid for i in procs),
                               name=d.name, account=d.account, partition=d.partition, qos=d.qos,
                               started_at=d.started_at, time_limit_s=d.time_limit_s))
        return out

    def node_info(self) -> NodeInfo:
        idle = sum(1 for s in self.gpu_states.values() if s.idle)
        busy = sum(
            1 for i, s in self.gpu_states.items()
            if not s.idle and not s.lost and self.readings[i].util_pct is not None
        )
        return NodeInfo(
            name=self.node, cluster=self.cluster, labels=dict(self.inputs.labels),
            gpu_count=len(self.readings), gpus_busy=busy, gpus_idle=idle, cordoned=self.inputs.cordoned,
            driver_version=self.driver_version, hostname=self.hostname, agent_id=self.agent_id,
            **(self.inputs.diag_fields() if self.inputs.diag_fields is not None else {}),
        )

    def snapshot(self, now: datetime) -> NodeSnapshot:
        """The whole node as of the latest sample."""
        procs = sorted(self.held.values(), key=lambda h: (h.ident.create_time, h.ident.pid))
        return NodeSnapshot(
            node=self.node_info(),
            gpus=[self.gpu_info(i, now) for i in sorted(self.readings)],
            processes=[self.process_info(h, now) for h in procs],
            jobs=self.jobs(),
        )
