"""Entity state: the latest node, GPU and process views, updated from snapshots and threshold events."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gpuevents.events import (
    AgentEvent,
    Event,
    GpuEvent,
    GpuInfo,
    GpuXidEvent,
    NodeInfo,
    ProcessEvent,
    ProcessInfo,
    SnapshotEvent,
)
from rules.expr import CLOCK_KEY
from rules.views import EntityView, EvalClock, GpuView, NodeView, ProcessView

CREATE_TIME_TOLERANCE_S = 1.0
"""psutil's create times wobble between reads; within this, the same pid is the same process."""


@dataclass(eq=False)
class Entity:
    """One evaluable entity: its key (unique, a process's includes its create time), id, and context."""

    key: str
    id: str
    kind: str
    node_key: str
    view: Any
    ctx: dict[str, Any]


@dataclass(eq=False)
class NodeState:
    """Everything known about one node; views are rebuilt from the infos whenever one changes."""

    key: str
    name: str
    cluster: str
    info: NodeInfo
    gpu_infos: dict[int, GpuInfo] = field(default_factory=dict)
    proc_infos: dict[str, ProcessInfo] = field(default_factory=dict)  # by entity key
    entities: dict[str, Entity] = field(default_factory=dict)
    node_entity: Entity | None = None
    last_seen: datetime | None = None
    interval_s: float | None = None
    online: bool = True
    offline_since: datetime | None = None
    stopping: bool = False

    @property
    def prefix(self) -> str:
        return self.key


@dataclass
class Change:
    """What an event changed: entities to evaluate, entities that are gone."""

    node_key: str
    changed: list[Entity]
    gone: list[Entity]


class FleetState:
    """Nodes, GPUs and processes by entity key; entity tables by kind for sweeps."""

    def __init__(self, clock: EvalClock, cluster: str = "default", owners: Mapping[str, str] | None = None) -> None:
        self.clock = clock
        self.cluster = cluster
        self.owners = dict(owners or {})
        self.nodes: dict[str, NodeState] = {}
        self.by_kind: dict[str, dict[str, Entity]] = {"node": {}, "gpu": {}, "process": {}}

    def node_key(self, cluster: str, name: str) -> str:
        return name if cluster == self.cluster else f"{cluster}:{name}"

    def apply(self, event: Event, now: datetime) -> Change | None:
        """Update the state from one event received at `now`; None when it carries no entity state.

        `last_seen` is the arrival time, not the event's: an agent with a slow clock must not look offline."""
        key = self.node_key(event.cluster, event.node)
        ns = self.nodes.get(key)
        if isinstance(event, SnapshotEvent):
            snap = event.data
            if ns is None:
                ns = self._new_node(key, event.node, event.cluster, snap.node)
            ns.info = snap.node
            ns.stopping = False
            old_gpus = ns.gpu_infos
            ns.gpu_infos = {g.index: self._idle_since(g, old_gpus.get(g.index), event.time) for g in snap.gpus}
            old_procs = ns.proc_infos
            ns.proc_infos = {}
            for p in snap.processes:
                ns.proc_infos[self._process_key(key, p, old_procs)] = p
        elif isinstance(event, GpuEvent | GpuXidEvent):
            if ns is None:
                ns = self._new_node(key, event.node, event.cluster, NodeInfo(name=event.node, cluster=event.cluster))
            g = event.data
            ns.gpu_infos[g.index] = self._idle_since(g, ns.gpu_infos.get(g.index), event.time)
        elif isinstance(event, ProcessEvent):
            if ns is None:
                ns = self._new_node(key, event.node, event.cluster, NodeInfo(name=event.node, cluster=event.cluster))
            p = event.data
            pkey = self._process_key(key, p, ns.proc_infos)
            if event.type == "process.started":
                ns.proc_infos[pkey] = p
            else:
                ns.proc_infos.pop(pkey, None)
        elif isinstance(event, AgentEvent):
            if ns is None:
                ns = self._new_node(key, event.node, event.cluster, NodeInfo(name=event.node, cluster=event.cluster))
            if event.type == "agent.started":
                ns.stopping = False
                if event.data.snapshot_interval_s:
                    ns.interval_s = event.data.snapshot_interval_s
            else:
                ns.stopping = True
            self._seen(ns, now)
            return None
        else:  # pragma: no cover - the Event union is closed
            return None
        self._seen(ns, now)
        return self.rebuild(ns)

    def _seen(self, ns: NodeState, t: datetime) -> None:
        if ns.last_seen is None or t > ns.last_seen:
            ns.last_seen = t

    def _new_node(self, key: str, name: str, cluster: str, info: NodeInfo) -> NodeState:
        ns = NodeState(key=key, name=name, cluster=cluster, info=info)
        self.nodes[key] = ns
        return ns

    @staticmethod
    def _idle_since(g: GpuInfo, old: GpuInfo | None, t: datetime) -> GpuInfo:
        if not g.idle or g.idle_since is not None:
            return g
        if g.idle_for_s is not None:
            since = t - timedelta(seconds=g.idle_for_s)
        elif old is not None and old.idle and old.idle_since is not None:
            since = old.idle_since
        else:
            since = t
        return g.model_copy(update={"idle_since": since})

    @staticmethod
    def _process_key(node_key: str, p: ProcessInfo, known: Mapping[str, ProcessInfo]) -> str:
        """The entity key of `p`: the known process with its pid and (nearly) its create time, else a new one."""
        key = f"{node_key}/pid{p.pid}@{int(p.create_time.timestamp())}"
        old = known.get(key)
        if old is not None and abs((old.create_time - p.create_time).total_seconds()) <= CREATE_TIME_TOLERANCE_S:
            return key
        prefix = f"{node_key}/pid{p.pid}@"
        for k, old in known.items():
            if old.pid == p.pid and k.startswith(prefix) and (
                abs((old.create_time - p.create_time).total_seconds()) <= CREATE_TIME_TOLERANCE_S
            ):
                return k
        return key

    def rebuild(self, ns: NodeState) -> Change:
        """Build the node's views from its infos; report what is new or changed and what is gone."""
        clock = self.clock
        owners = self.owners
        nkey = ns.key
        info = ns.info
        gpu_infos = ns.gpu_infos
        n_idle = sum(1 for g in gpu_infos.values() if g.idle)
        node_view = NodeView(
            id=nkey, name=ns.name, cluster=ns.cluster, labels=dict(info.labels), gpu_count=len(gpu_infos) or info.gpu_count,
            gpus_busy=len(gpu_infos) - n_idle if gpu_infos else info.gpus_busy, gpus_idle=n_idle if gpu_infos else info.gpus_idle,
            online=ns.online and not ns.stopping, last_seen=ns.last_seen, cordoned=info.cordoned,
            driver_version=info.driver_version, hostname=info.hostname,
        )
        procs: dict[str, ProcessView] = {}
        by_pid: dict[int, ProcessView] = {}
        for pkey, p in ns.proc_infos.items():
            owner = p.owner or (owners.get(p.user, p.user) if p.user else None)
            pv = ProcessView(
                clock, id=pkey.split("@", 1)[0], node=ns.name, pid=p.pid, name=p.name, cmdline=p.cmdline, user=p.user,
                uid=p.uid, owner=owner, create_time=p.create_time, ppid=p.ppid, gpus=list(p.gpus),
                gpu_mem_mib=p.gpu_mem_mib, gpu_util_pct=p.gpu_util_pct, container_id=p.container_id,
                pod_uid=p.pod_uid, pod=p.pod, labels=dict(p.labels),
            )
            procs[pkey] = pv
            by_pid[p.pid] = pv
        pids_of: dict[int, list[int]] = {}
        for pv in procs.values():
            for i in pv.gpus:
                pids_of.setdefault(i, []).append(pv.pid)
        gpus: dict[int, GpuView] = {}
        for idx in sorted(gpu_infos):
            g = gpu_infos[idx]
            pids = list(g.pids)
            for pid in pids_of.get(idx, ()):
                if pid not in pids:
                    pids.append(pid)
            on_gpu = sorted((by_pid[p] for p in pids if p in by_pid), key=lambda v: v.create_time)
            gpu_owners: list[str] = []
            for pv in on_gpu:
                if pv.owner and pv.owner not in gpu_owners:
                    gpu_owners.append(pv.owner)
            if not on_gpu and g.owners:
                gpu_owners = list(g.owners)
            mem_pct = g.mem_pct
            if mem_pct is None and g.mem_used_mib is not None and g.mem_total_mib:
                mem_pct = 100.0 * g.mem_used_mib / g.mem_total_mib
            gpus[idx] = GpuView(
                clock, id=f"{nkey}/gpu{idx}", node=ns.name, index=idx, uuid=g.uuid, model=g.model,
                util_pct=g.util_pct, mem_used_mib=g.mem_used_mib, mem_total_mib=g.mem_total_mib, mem_pct=mem_pct,
                temp_c=g.temp_c, power_w=g.power_w, power_limit_w=g.power_limit_w, fan_pct=g.fan_pct,
                ecc_uncorrected=g.ecc_uncorrected, idle=g.idle, idle_since=g.idle_since, pids=pids,
                processes=on_gpu, owners=gpu_owners, owner=gpu_owners[0] if gpu_owners else (g.owner or None),
                mig_parent=g.mig_parent, lost=g.lost,
            )
        gpu_list = list(gpus.values())
        new: dict[str, Entity] = {}
        node_ent = Entity(nkey, nkey, "node", nkey, node_view, {
            "node": node_view, "gpus": gpu_list, "entity": EntityView(nkey, "node", ns.name, ns.cluster), CLOCK_KEY: clock,
        })
        new[nkey] = node_ent
        for gv in gpu_list:
            new[gv.id] = Entity(gv.id, gv.id, "gpu", nkey, gv, {
                "gpu": gv, "node": node_view, "entity": EntityView(gv.id, "gpu", ns.name, ns.cluster), CLOCK_KEY: clock,
            })
        for pkey, pv in procs.items():
            new[pkey] = Entity(pkey, pv.id, "process", nkey, pv, {
                "process": pv, "node": node_view, "gpus": [gpus[i] for i in pv.gpus if i in gpus],
                "entity": EntityView(pv.id, "process", ns.name, ns.cluster), CLOCK_KEY: clock,
            })
        gone = [e for k, e in ns.entities.items() if k not in new]
        for e in gone:
            self.by_kind[e.kind].pop(e.key, None)
        for k, e in new.items():
            self.by_kind[e.kind][k] = e
        ns.entities = new
        ns.node_entity = node_ent
        return Change(nkey, list(new.values()), gone)

    def remove_node(self, key: str) -> list[Entity]:
        """Forget a node; its entities are gone."""
        ns = self.nodes.pop(key, None)
        if ns is None:
            return []
        for e in ns.entities.values():
            self.by_kind[e.kind].pop(e.key, None)
        return list(ns.entities.values())

    def set_online(self, ns: NodeState, online: bool, now: datetime) -> None:
        ns.online = online
        ns.offline_since = None if online else (ns.offline_since or now)
        if ns.node_entity is not None:
            ns.node_entity.view.online = online and not ns.stopping
