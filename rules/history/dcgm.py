"""dcgm-exporter's series rebuilt into node snapshots, as an agent would have sent them: one per node per step, its
GPUs (MIG instances too) with utilisation, memory, power and SM activity, held by the pod the series name. Pure.

Labels as dcgm-exporter writes them: `Hostname`, `gpu`, `UUID`, `modelName`; `GPU_I_PROFILE` and `GPU_I_ID` on a
MIG instance (whose `UUID` is its parent's); `pod`, `namespace`, `container` in Kubernetes mode (`exported_pod`
and the like where Prometheus renamed them, the plain ones then naming the exporter's own pod).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gpuevents.events import GpuInfo, JobInfo, NodeInfo, NodeSnapshot, SnapshotEvent, make_event
from gpuevents.idleness import IdleRule
from rules.history.promapi import Series

METRICS: dict[str, str] = {
    "util": "DCGM_FI_DEV_GPU_UTIL",
    "fb_used": "DCGM_FI_DEV_FB_USED",
    "fb_free": "DCGM_FI_DEV_FB_FREE",
    "power": "DCGM_FI_DEV_POWER_USAGE",
    "gr_active": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "sm_active": "DCGM_FI_PROF_SM_ACTIVE",
    "tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
}
"""What is read, by our name: the first four are dcgm-exporter's defaults, the profiling ones are there where the
site enabled them (a MIG instance has no DCGM_FI_DEV_GPU_UTIL: its graphics engine activity stands in)."""
REQUIRED = ("util", "fb_used")
MIG_INDEX_BASE = 100
"""A MIG instance's index: 100 × (its GPU + 1) + its GPU instance id (GPU 0's instance 3 is 103), stable across
imports and never a whole GPU's."""


@dataclass(frozen=True, slots=True, order=True)
class GpuId:
    node: str
    index: int
    gpu: int
    uuid: str
    model: str
    profile: str = ""


@dataclass(slots=True)
class Reading:
    """One GPU at one step: the metrics that had a value, and the pod that held it."""

    values: dict[str, float] = field(default_factory=dict)
    pod: str = ""
    namespace: str = ""
    container: str = ""


def _label(labels: Mapping[str, str], name: str) -> str:
    return labels.get(f"exported_{name}") or ("" if f"exported_{name}" in labels else labels.get(name, ""))


def gpu_of(labels: Mapping[str, str]) -> GpuId | None:
    """Which GPU (or MIG instance) a series is of; None where it names no GPU."""
    node = labels.get("Hostname") or labels.get("instance", "").rsplit(":", 1)[0]
    try:
        gpu = int(labels.get("gpu", ""))
    except ValueError:
        return None
    model = labels.get("modelName", "")
    profile, gi = labels.get("GPU_I_PROFILE", ""), labels.get("GPU_I_ID", "")
    if profile and gi.isdigit():
        return GpuId(node, MIG_INDEX_BASE * (gpu + 1) + int(gi), gpu, labels.get("UUID", ""),
                     f"{model} MIG {profile}", profile)
    return GpuId(node, gpu, gpu, labels.get("UUID", ""), model)


Grid = dict[float, dict[GpuId, Reading]]


def grid(series: Mapping[str, Iterable[Series]]) -> Grid:
    """Every step's readings by GPU, from each metric's series (keyed by our names, METRICS)."""
    out: Grid = defaultdict(dict)
    for name, found in series.items():
        for s in found:
            gpu = gpu_of(s.labels)
            if gpu is None or not gpu.node:
                continue
            pod, namespace = _label(s.labels, "pod"), _label(s.labels, "namespace")
            container = _label(s.labels, "container")
            for t, v in s.values:
                if math.isnan(v):  # no reading (and where a series ended, the mark its end left)
                    continue
                r = out[t].get(gpu)
                if r is None:
                    r = out[t][gpu] = Reading()
                r.values[name] = v
                if pod:
                    r.pod, r.namespace, r.container = pod, namespace, container
    return out


@dataclass(frozen=True)
class Classify:
    """How a reading becomes a GPU's state: idle by the config's idle rule for its model; held while a pod holds it
    or more than `mem_floor_mib` of its memory is in use.

    A pod's owner and team as the agent finds them: its `owner_label` and `team_label` where kube-state-metrics'
    `kube_pod_labels` has them (`pod_labels`, by namespace and pod, refreshed per chunk); else the namespace,
    through config `owners` for the owner."""

    idle_rule: Callable[[str | None], IdleRule]
    mem_floor_mib: float = 256.0
    owners: Mapping[str, str] = field(default_factory=dict)
    owner_label: str | None = None
    team_label: str | None = None
    pod_labels: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)

    def owner_of(self, namespace: str, pod: str) -> str | None:
        found = self.pod_labels.get((namespace, pod), {})
        if self.owner_label and found.get(self.owner_label):
            return found[self.owner_label]
        return self.owners.get(namespace, namespace) if namespace else None

    def team_of(self, namespace: str, pod: str) -> str | None:
        found = self.pod_labels.get((namespace, pod), {})
        if self.team_label and found.get(self.team_label):
            return found[self.team_label]
        return namespace or None


def kube_label(name: str) -> str:
    """The name kube-state-metrics gives a pod label in `kube_pod_labels` (`app.kubernetes.io/team` →
    `label_app_kubernetes_io_team`)."""
    return "label_" + "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def pod_labels(series: Iterable[Mapping[str, str]]) -> dict[tuple[str, str], dict[str, str]]:
    """`kube_pod_labels` series as each pod's labels, by (namespace, pod), under their Kubernetes names' mangled
    form (look them up with `kube_label`)."""
    return {(s.get("namespace", ""), s.get("pod", "")): dict(s) for s in series if s.get("pod")}


def job_id(namespace: str, pod: str) -> str:
    return f"{namespace}/{pod}" if namespace else pod


def gpu_info(g: GpuId, r: Reading, how: Classify, idle_since: datetime | None, at: datetime) -> GpuInfo:
    v = r.values
    util = v.get("util")
    if util is None and "gr_active" in v:
        util = 100.0 * v["gr_active"]
    sm = 100.0 * v["sm_active"] if "sm_active" in v else None
    used, free = v.get("fb_used"), v.get("fb_free")
    total = used + free if used is not None and free is not None else None
    power = v.get("power")
    idle = how.idle_rule(g.model).verdict(util, sm, power) is True
    in_use = r.pod != "" or (used is not None and used > how.mem_floor_mib)
    job = job_id(r.namespace, r.pod) if r.pod else None
    owner = how.owner_of(r.namespace, r.pod) if r.pod else None
    return GpuInfo(
        node=g.node, index=g.index, uuid=g.uuid, model=g.model or None, util_pct=util, mem_used_mib=used,
        mem_total_mib=total, power_w=power, idle=idle, idle_since=idle_since if idle else None,
        idle_for_s=(at - idle_since).total_seconds() if idle and idle_since is not None else None,
        allocated=True if in_use else None, job=job, owner=owner, owners=[owner] if owner else [],
        mig_parent=g.uuid if g.profile else None, sm_active_pct=sm,
        tensor_active_pct=100.0 * v["tensor_active"] if "tensor_active" in v else None)


class Rebuilder:
    """Turns grids into snapshot events step by step, remembering since when each GPU has been idle (so the
    rules' `idle for` reads as it would have live) across the chunks of one import."""

    def __init__(self, cluster: str, how: Classify) -> None:
        self.cluster = cluster
        self.how = how
        self._idle_since: dict[GpuId, datetime] = {}

    def events(self, readings: Grid) -> Iterator[SnapshotEvent]:
        for t in sorted(readings):
            at = datetime.fromtimestamp(t, UTC)
            by_node: dict[str, list[tuple[GpuId, Reading]]] = defaultdict(list)
            for g, r in readings[t].items():
                by_node[g.node].append((g, r))
            for node in sorted(by_node):
                yield self._snapshot(node, sorted(by_node[node], key=lambda x: x[0].index), at)

    def _snapshot(self, node: str, gpus: list[tuple[GpuId, Reading]], at: datetime) -> SnapshotEvent:
        infos: list[GpuInfo] = []
        jobs: dict[str, JobInfo] = {}
        for g, r in gpus:
            since = self._idle_since.get(g)
            info = gpu_info(g, r, self.how, since or at, at)
            if info.idle:
                self._idle_since.setdefault(g, at)
            else:
                self._idle_since.pop(g, None)
            infos.append(info)
            if info.job is not None:
                j = jobs.get(info.job)
                if j is None:
                    team = self.how.team_of(r.namespace, r.pod)
                    j = jobs[info.job] = JobInfo(id=info.job, scheduler="kubernetes", owner=info.owner,
                                                 user=r.namespace or None, namespace=r.namespace or None,
                                                 name=r.pod, pods=[r.pod], labels={"team": team} if team else {})
                j.gpus.append(info.index)
        physical = len({g.gpu for g, _r in gpus})
        snap = NodeSnapshot(node=NodeInfo(name=node, cluster=self.cluster, gpu_count=physical), gpus=infos,
                            processes=[], jobs=list(jobs.values()))
        return make_event("node.snapshot", node, snap, cluster=self.cluster, time=at)
