"""Entity state: the latest node, GPU and process views, updated from snapshots and threshold events."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from operator import itemgetter
from typing import Any

from gpuevents.events import (
    AgentEvent,
    Event,
    GpuEvent,
    GpuInfo,
    GpuXidEvent,
    NodeInfo,
    NodeSnapshot,
    ProcessEvent,
    ProcessInfo,
    SnapshotEvent,
)
from rules.lang.expr import CLOCK_KEY
from rules.lang.views import EntityView, EvalClock, GpuView, NodeView, ProcessView

CREATE_TIME_TOLERANCE_S = 1.0
"""psutil's create times wobble between reads; within this, the same pid is the same process."""


def _fields_getter(model: type[Any], ignore: frozenset[str]) -> Callable[[Any], tuple[Any, ...]]:
    """The values of `model`'s fields but `ignore`, as one tuple, to tell whether a view's inputs changed."""
    get = itemgetter(*(k for k in model.model_fields if k not in ignore))
    return lambda m: get(m.__dict__)


_node_fields = _fields_getter(NodeInfo, frozenset({"online", "last_seen"}))
_gpu_fields = _fields_getter(GpuInfo, frozenset({"idle_for_s"}))
_process_fields = _fields_getter(ProcessInfo, frozenset({"age_s"}))
"""What a view is built from; `online`/`last_seen` are the engine's, the others only move with time."""


def _gpu_raw(g: GpuInfo) -> tuple[Any, ...]:
    """A GPU's inputs; `idle_for_s` counts only when it is what `idle_since` is derived from."""
    if g.idle and g.idle_since is None and g.idle_for_s is not None:
        return (*_gpu_fields(g), g.idle_for_s)
    return _gpu_fields(g)


def _snapshot_sig(snap: NodeSnapshot) -> tuple[Any, ...]:
    return (
        _node_fields(snap.node), tuple(map(_gpu_raw, snap.gpus)), tuple(map(_process_fields, snap.processes)),
    )


def _same_items(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


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
    full_next: bool = False  # rebuild every view and report every entity next time (the core skipped one)
    node_sig: tuple[Any, ...] = ()
    gpu_sigs: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    proc_sigs: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    gpu_views: list[GpuView] = field(default_factory=list)
    snap_sig: tuple[Any, ...] | None = None  # the last snapshot's inputs, while nothing else changed them
    snapshot: NodeSnapshot | None = None  # the snapshot the views were built from (kept while repeated)


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
            # The very snapshot object the views stand on (the engine's decoder reuses it for repeated bytes)
            # is equal to itself: no need to compare.
            sig = ns.snap_sig if ns is not None and snap is ns.snapshot else _snapshot_sig(snap)
            if ns is not None and sig is not None and sig == ns.snap_sig and self._unchanged(ns):
                # The node repeats its last snapshot (times aside): every view stays, nothing to evaluate.
                self._seen(ns, now)
                assert ns.node_entity is not None
                ns.node_entity.view.last_seen = ns.last_seen
                return Change(key, [], [])
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
            self._seen(ns, now)
            change = self.rebuild(ns)
            ns.snap_sig = sig
            ns.snapshot = snap
            return change
        elif isinstance(event, GpuEvent | GpuXidEvent):
            if ns is None:
                ns = self._new_node(key, event.node, event.cluster, NodeInfo(name=event.node, cluster=event.cluster))
            g = event.data
            ns.snap_sig = None
            ns.gpu_infos[g.index] = self._idle_since(g, ns.gpu_infos.get(g.index), event.time)
        elif isinstance(event, ProcessEvent):
            if ns is None:
                ns = self._new_node(key, event.node, event.cluster, NodeInfo(name=event.node, cluster=event.cluster))
            p = event.data
            ns.snap_sig = None
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

    @staticmethod
    def _unchanged(ns: NodeState) -> bool:
        """Whether the node's views are as its last rebuild left them (same online state, nothing pending)."""
        return (
            not ns.full_next and not ns.stopping and ns.node_entity is not None and bool(ns.node_sig)
            and ns.node_sig[-1] == ns.online
        )

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
        """Build the node's views from its infos; report what is new or changed and what is gone.

        A view whose inputs equal the ones it was built from (ignoring `idle_for_s` and `age_s`, which only
        move with time) is kept, and so is the entity; only new and changed entities are in `changed`, since a
        condition can only change when its inputs do (time-dependent ones are re-swept on ticks). A change to
        the node's own fields, its online state, or `full_next` set rebuilds and reports everything."""
        clock = self.clock
        owners = self.owners
        nkey = ns.key
        info = ns.info
        gpu_infos = ns.gpu_infos
        old_entities = ns.entities
        n_idle = sum(1 for g in gpu_infos.values() if g.idle)
        online = ns.online and not ns.stopping
        node_sig = (
            _node_fields(info), len(gpu_infos) or info.gpu_count,
            len(gpu_infos) - n_idle if gpu_infos else info.gpus_busy, n_idle if gpu_infos else info.gpus_idle,
            online,
        )
        old_node = ns.node_entity
        full = ns.full_next or old_node is None or node_sig != ns.node_sig
        ns.full_next = False
        if full:
            node_view = NodeView(
                id=nkey, name=ns.name, cluster=ns.cluster, labels=dict(info.labels), gpu_count=node_sig[1],
                gpus_busy=node_sig[2], gpus_idle=node_sig[3], online=online, last_seen=ns.last_seen,
                cordoned=info.cordoned, driver_version=info.driver_version, hostname=info.hostname,
            )
            ns.node_sig = node_sig
        else:
            assert old_node is not None
            node_view = old_node.view
            node_view.last_seen = ns.last_seen
        old_psigs = ns.proc_sigs
        new_psigs: dict[str, tuple[Any, ...]] = {}
        procs: dict[str, ProcessView] = {}
        fresh: set[int] = set()  # ids of views built now
        by_pid: dict[int, ProcessView] = {}
        for pkey, p in ns.proc_infos.items():
            sig = _process_fields(p)
            new_psigs[pkey] = sig
            old = old_entities.get(pkey)
            if not full and old is not None and old_psigs.get(pkey) == sig:
                pv = old.view
            else:
                owner = p.owner or (owners.get(p.user, p.user) if p.user else None)
                pv = ProcessView(
                    clock, id=pkey.split("@", 1)[0], node=ns.name, pid=p.pid, name=p.name, cmdline=p.cmdline,
                    user=p.user, uid=p.uid, owner=owner, create_time=p.create_time, ppid=p.ppid, gpus=list(p.gpus),
                    gpu_mem_mib=p.gpu_mem_mib, gpu_util_pct=p.gpu_util_pct, container_id=p.container_id,
                    pod_uid=p.pod_uid, pod=p.pod, labels=dict(p.labels),
                )
                fresh.add(id(pv))
            procs[pkey] = pv
            by_pid[p.pid] = pv
        ns.proc_sigs = new_psigs
        pids_of: dict[int, list[int]] = {}
        for pv in procs.values():
            for i in pv.gpus:
                pids_of.setdefault(i, []).append(pv.pid)
        old_gsigs = ns.gpu_sigs
        new_gsigs: dict[int, tuple[Any, ...]] = {}
        gpus: dict[int, GpuView] = {}
        for idx in sorted(gpu_infos):
            g = gpu_infos[idx]
            pids = list(g.pids)
            for pid in pids_of.get(idx, ()):
                if pid not in pids:
                    pids.append(pid)
            on_gpu = sorted((by_pid[p] for p in pids if p in by_pid), key=lambda v: v.create_time)
            sig = _gpu_fields(g)
            new_gsigs[idx] = sig
            old = old_entities.get(f"{nkey}/gpu{idx}")
            if (
                not full and old is not None and old_gsigs.get(idx) == sig and old.view.pids == pids
                and _same_items(old.view.processes, on_gpu)
            ):
                gpus[idx] = old.view
                continue
            gpu_owners: list[str] = []
            for pv in on_gpu:
                if pv.owner and pv.owner not in gpu_owners:
                    gpu_owners.append(pv.owner)
            if not on_gpu and g.owners:
                gpu_owners = list(g.owners)
            mem_pct = g.mem_pct
            if mem_pct is None and g.mem_used_mib is not None and g.mem_total_mib:
                mem_pct = 100.0 * g.mem_used_mib / g.mem_total_mib
            gv = gpus[idx] = GpuView(
                clock, id=f"{nkey}/gpu{idx}", node=ns.name, index=idx, uuid=g.uuid, model=g.model,
                util_pct=g.util_pct, mem_used_mib=g.mem_used_mib, mem_total_mib=g.mem_total_mib, mem_pct=mem_pct,
                temp_c=g.temp_c, power_w=g.power_w, power_limit_w=g.power_limit_w, fan_pct=g.fan_pct,
                ecc_uncorrected=g.ecc_uncorrected, idle=g.idle, idle_since=g.idle_since, pids=pids,
                processes=on_gpu, owners=gpu_owners, owner=gpu_owners[0] if gpu_owners else (g.owner or None),
                mig_parent=g.mig_parent, lost=g.lost,
            )
            fresh.add(id(gv))
        ns.gpu_sigs = new_gsigs
        gpu_list = list(gpus.values())
        new: dict[str, Entity] = {}
        changed: list[Entity] = []
        by_kind = self.by_kind
        nodes_changed = full or len(gpus) != len(ns.gpu_views) or any(id(gv) in fresh for gv in gpu_list)
        if nodes_changed or old_node is None:
            node_ent = Entity(nkey, nkey, "node", nkey, node_view, {
                "node": node_view, "gpus": gpu_list, "entity": EntityView(nkey, "node", ns.name, ns.cluster),
                CLOCK_KEY: clock,
            })
            changed.append(node_ent)
        else:
            node_ent = old_node
        new[nkey] = node_ent
        ns.gpu_views = gpu_list
        for gv in gpu_list:
            key = gv.id
            if id(gv) in fresh:
                ent = Entity(key, key, "gpu", nkey, gv, {
                    "gpu": gv, "node": node_view, "entity": EntityView(key, "gpu", ns.name, ns.cluster),
                    CLOCK_KEY: clock,
                })
                changed.append(ent)
            else:
                ent = old_entities[key]
            new[key] = ent
        for pkey, pv in procs.items():
            pgpus = [gpus[i] for i in pv.gpus if i in gpus]
            old = old_entities.get(pkey)
            if (
                old is None or old.view is not pv or any(id(gv) in fresh for gv in pgpus)
                or not _same_items(old.ctx["gpus"], pgpus)
            ):
                ent = Entity(pkey, pv.id, "process", nkey, pv, {
                    "process": pv, "node": node_view, "gpus": pgpus,
                    "entity": EntityView(pv.id, "process", ns.name, ns.cluster), CLOCK_KEY: clock,
                })
                changed.append(ent)
            else:
                ent = old
            new[pkey] = ent
        gone = [e for k, e in old_entities.items() if k not in new]
        for e in gone:
            by_kind[e.kind].pop(e.key, None)
        for e in changed:
            by_kind[e.kind][e.key] = e
        ns.entities = new
        ns.node_entity = node_ent
        return Change(nkey, changed, gone)

    def current_snapshot(self, event: SnapshotEvent) -> NodeSnapshot:
        """After `apply(event)`: the snapshot the node's views stand on, which is `event.data` or, when the node
        repeated itself, the earlier snapshot equal to it but for `idle_for_s`, `age_s`, `online`, `last_seen`
        (handing that one on lets the new copy be freed at once instead of aging through the collector)."""
        ns = self.nodes.get(self.node_key(event.cluster, event.node))
        return ns.snapshot if ns is not None and ns.snapshot is not None else event.data

    def remove_node(self, key: str) -> list[Entity]:
        """Forget a node; its entities are gone."""
        ns = self.nodes.pop(key, None)
        if ns is None:
            return []
        for e in ns.entities.values():
            self.by_kind[e.kind].pop(e.key, None)
        return list(ns.entities.values())

    def online(self, ent: Entity) -> bool:
        """Whether `ent`'s node is known and online."""
        ns = self.nodes.get(ent.node_key)
        return ns is not None and ns.online

    def set_online(self, ns: NodeState, online: bool, now: datetime) -> None:
        ns.online = online
        ns.offline_since = None if online else (ns.offline_since or now)
        if ns.node_entity is not None:
            ns.node_entity.view.online = online and not ns.stopping
