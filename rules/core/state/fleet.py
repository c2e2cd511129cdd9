"""The fleet: every node's state by key and every entity by kind, updated from snapshots and threshold events."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from datetime import datetime, timedelta

from msgspec.structs import replace

from gpuevents.agentdata import GpuInfo, JobInfo, NodeInfo, NodeSnapshot, ProcessInfo
from gpuevents.events import (
    AgentEvent,
    DemandEvent,
    Event,
    GpuEvent,
    GpuXidEvent,
    JobEndedEvent,
    ProcessEvent,
    SnapshotEvent,
)
from rules.core.state.demand import DemandBook
from rules.core.state.jobs import Jobs, ended_entity
from rules.core.state.node import Change, Entity, NodeState
from rules.core.state.rebuild import rebuild, same_inputs, timed
from rules.lang.views import DemandView, EvalClock

CREATE_TIME_TOLERANCE_S = 1.0
"""psutil's create times wobble between reads; within this, the same pid is the same process."""


class FleetState:
    """Nodes, GPUs and processes by entity key; entity tables by kind for sweeps."""

    def __init__(self, clock: EvalClock, cluster: str = "default", owners: Mapping[str, str] | None = None) -> None:
        self.clock = clock
        self.cluster = cluster
        self.owners = dict(owners or {})
        self.nodes: dict[str, NodeState] = {}
        self.by_kind: dict[str, dict[str, Entity]] = {"node": {}, "gpu": {}, "process": {}, "job": {}}
        self.jobs = Jobs(clock, self.owners)
        self.demand = DemandBook(clock)
        self.node_jobs: dict[str, list[JobInfo]] = {}  # node key -> the jobs its last snapshot listed
        self._offline: set[str] = set()  # keys of the known nodes that are offline
        self._announced: dict[str, float] = {}  # snapshot intervals agents announced before their first snapshot
        self._touched: dict[str, None] = {}  # keys of nodes whose liveness inputs may have changed, in order

    def take_touched(self) -> dict[str, None]:
        """The keys of the nodes added, removed or changed in what liveness reads (`last_seen`, `interval_s`,
        `stopping`, `online`, `offline_since`) since the last call, a node added after any other it follows."""
        touched, self._touched = self._touched, {}
        return touched

    def node_key(self, cluster: str, name: str) -> str:
        return name if cluster == self.cluster else f"{cluster}:{name}"

    def apply(self, event: Event, now: datetime) -> Change | None:
        """Update the state from one event received at `now`; None when it carries no entity state.

        `last_seen` is the arrival time, not the event's: an agent with a slow clock must not look offline."""
        if isinstance(event, DemandEvent):
            self.demand.apply(event)  # no entity changes: conditions reading `demand` go with the tick
            return None
        key = self.node_key(event.cluster, event.node)
        ns = self.nodes.get(key)
        if isinstance(event, SnapshotEvent):
            snap = event.data
            # The very snapshot object the views stand on (the engine's decoder reuses it for repeated bytes)
            # is equal to itself: no need to compare.
            if ns is not None and self._repeats(ns, snap, event.time):
                # The node repeats its last snapshot (times aside): every view stays, nothing to evaluate.
                self._seen(ns, now)
                assert ns.node_entity is not None
                ns.node_entity.view.last_seen = ns.last_seen
                return Change(key, [], [])
            if ns is None:
                ns = self._new_node(key, event.node, event.cluster, snap.node)
                ns.interval_s = self._announced.pop(key, None)
            ns.info = snap.node
            ns.stopping = False
            old_gpus = ns.gpu_infos
            allocation = _allocation(snap)
            ns.gpu_infos = {g.index: self._idle_since(_allocated(g, allocation), old_gpus.get(g.index), event.time)
                            for g in snap.gpus}
            if ns.xids or any(g.xid is not None for g in snap.gpus):
                self._keep_xids(ns, event.time)
            old_procs = ns.proc_infos
            ns.proc_infos = {}
            for p in snap.processes:
                ns.proc_infos[self._process_key(key, p, old_procs)] = p
            self._seen(ns, now)
            change = self.rebuild(ns)
            ns.snap_valid = True
            ns.snap_time = event.time
            ns.snap_timed = timed(snap)
            ns.snapshot = snap
            if snap.jobs:
                self.node_jobs[key] = list(snap.jobs)
            else:
                self.node_jobs.pop(key, None)
            return self._with_jobs(ns, change)
        elif ns is None:
            # A node is known from its first snapshot on (DESIGN §3.3): what a threshold or lifecycle event says
            # of a node not seen yet (a restarted engine's, say) changes nothing; its next snapshot says it all.
            if isinstance(event, AgentEvent) and event.type == "agent.started" and event.data.snapshot_interval_s:
                self._announced[key] = event.data.snapshot_interval_s
            return None
        elif isinstance(event, GpuEvent | GpuXidEvent):
            g = event.data
            if isinstance(event, GpuXidEvent):
                ns.xids[g.index] = (event.data.xid, event.time)
                g = replace(g, xid_at=event.time)
            ns.snap_valid = False
            ns.gpu_infos[g.index] = self._idle_since(g, ns.gpu_infos.get(g.index), event.time)
        elif isinstance(event, ProcessEvent):
            p = event.data
            ns.snap_valid = False
            pkey = self._process_key(key, p, ns.proc_infos)
            if event.type == "process.started":
                ns.proc_infos[pkey] = p
            else:
                ns.proc_infos.pop(pkey, None)
        elif isinstance(event, AgentEvent):
            if event.type == "agent.started":
                ns.stopping = False
                if event.data.snapshot_interval_s:
                    ns.interval_s = event.data.snapshot_interval_s
            else:
                ns.stopping = True
            self._seen(ns, now)
            if ns.node_entity is not None:
                ns.node_entity.view.last_seen = ns.last_seen  # as a rebuild of the node now would show it
            return None
        else:  # pragma: no cover - the Event union is closed
            return None
        self._seen(ns, now)
        return self._with_jobs(ns, self.rebuild(ns))

    def refresh(self, ns: NodeState) -> Change:
        """Rebuild the node's views (in full, if marked so) and its jobs: what changed, to evaluate."""
        return self._with_jobs(ns, self.rebuild(ns))

    def ended_job(self, event: JobEndedEvent) -> Entity:
        """The entity a `job.ended` event closes (see `jobs.ended_entity`), with `demand` like every other."""
        d = event.data
        node = d.nodes[0] if d.nodes else event.node
        ent = ended_entity(d, self.node_key(event.cluster, node), node, event.cluster, self.clock, self.owners)
        ent.ctx["demand"] = DemandView(self.clock, self.demand, event.cluster, ent.ctx)
        return ent

    def _with_jobs(self, ns: NodeState, change: Change) -> Change:
        """The node's change, with the jobs it holds (or held) rebuilt: their GPUs are the node's."""
        jobs = self.node_jobs.get(ns.key, [])
        if jobs or ns.key in self.jobs.of_node:
            changed, gone = self.jobs.update_node(ns, jobs, self.nodes, self.by_kind)
            change = Change(change.node_key, [*change.changed, *changed], [*change.gone, *gone], change.deltas)
        self._with_demand(change.changed, ns.cluster)
        return change

    def _with_demand(self, ents: list[Entity], cluster: str) -> None:
        """Give new entities `demand`, as every entity has."""
        for e in ents:
            if "demand" not in e.ctx:
                head = self.nodes.get(e.node_key) if e.kind == "job" else None
                e.ctx["demand"] = DemandView(self.clock, self.demand, cluster, e.ctx,
                                             dict(head.info.labels) if head is not None else None)

    @staticmethod
    def _keep_xids(ns: NodeState, t: datetime) -> None:
        """A snapshot may not repeat the XID a GPU reported in a threshold event: keep the last one known, with
        the time it was first seen."""
        for idx, g in ns.gpu_infos.items():
            known = ns.xids.get(idx)
            if g.xid is not None:
                at = g.xid_at or (known[1] if known is not None and known[0] == g.xid else t)
                if g.xid_at is None:
                    ns.gpu_infos[idx] = replace(g, xid_at=at)
                ns.xids[idx] = (g.xid, at)
            elif known is not None:
                ns.gpu_infos[idx] = replace(g, xid=known[0], xid_at=known[1])

    def _repeats(self, ns: NodeState, snap: NodeSnapshot, t: datetime) -> bool:
        """Whether `snap` (at `t`) repeats the snapshot the node's views stand on, times aside, while nothing else
        changed them."""
        old, old_t = ns.snapshot, ns.snap_time
        if old is None or old_t is None or not ns.snap_valid or not self._unchanged(ns):
            return False
        return (snap is old and not ns.snap_timed) or same_inputs(old, old_t, snap, t)

    @staticmethod
    def _unchanged(ns: NodeState) -> bool:
        """Whether the node's views are as its last rebuild left them (same online state, nothing pending)."""
        return (
            not ns.full_next and not ns.stopping and ns.node_entity is not None and bool(ns.node_sig)
            and ns.node_sig[-1] == ns.online
        )

    def _seen(self, ns: NodeState, t: datetime) -> None:
        self._touched[ns.key] = None
        if ns.last_seen is None or t > ns.last_seen:
            ns.last_seen = t

    def _new_node(self, key: str, name: str, cluster: str, info: NodeInfo) -> NodeState:
        ns = NodeState(key=key, name=name, cluster=cluster, info=info)
        self.nodes[key] = ns
        self._touched.pop(key, None)
        self._touched[key] = None  # after the nodes added before it, as in `nodes`
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
        return replace(g, idle_since=since)

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
        """Build the node's views from its infos (see `rebuild`); what is new or changed, and what is gone."""
        return rebuild(ns, self.clock, self.owners, self.by_kind)

    def current_snapshot(self, event: SnapshotEvent) -> NodeSnapshot:
        """After `apply(event)`: the snapshot the node's views stand on, which is `event.data` or, when the node
        repeated itself, the earlier snapshot equal to it but for `idle_for_s`, `age_s`, `online`, `last_seen`
        (handing that one on lets the new copy be freed at once instead of aging through the collector)."""
        ns = self.nodes.get(self.node_key(event.cluster, event.node))
        return ns.snapshot if ns is not None and ns.snapshot is not None else event.data

    def remove_node(self, key: str) -> Change:
        """Forget a node: its entities are gone, and the jobs it held part of are rebuilt from their other nodes
        (to evaluate again) or gone with it."""
        ns = self.nodes.pop(key, None)
        if ns is None:
            return Change(key, [], [])
        self._touched[key] = None
        self._offline.discard(key)
        for e in ns.entities.values():
            self.by_kind[e.kind].pop(e.key, None)
        self.node_jobs.pop(key, None)
        jobs_changed, jobs_gone = self.jobs.remove_node(key, self.nodes, self.by_kind)
        self._with_demand(jobs_changed, ns.cluster)
        return Change(key, jobs_changed, [*ns.entities.values(), *jobs_gone])

    def jobs_of(self, node_key: str) -> list[Entity]:
        """The job entities the node holds a part of."""
        keys = self.jobs.of_node.get(node_key)
        if not keys:
            return []
        table = self.by_kind["job"]
        return [e for e in map(table.get, sorted(keys)) if e is not None]

    def entities_by_id(self, kind: str, entity_id: str) -> list[Entity]:
        """The entities of `kind` with this id (a process's id is its node and pid: its key adds the start)."""
        e = self.by_kind[kind].get(entity_id)
        if e is not None:
            return [e]
        if kind == "job":  # a Kubernetes job's key adds its owner's uid
            return [e for e in self.by_kind["job"].values() if e.id == entity_id]
        if kind != "process":
            return []
        ns = self.nodes.get(entity_id.rsplit("/", 1)[0])
        if ns is not None:
            return [e for e in ns.entities.values() if e.kind == "process" and e.id == entity_id]
        return [e for e in self.by_kind["process"].values() if e.id == entity_id]

    def online(self, ent: Entity) -> bool:
        """Whether `ent`'s node is known and online."""
        ns = self.nodes.get(ent.node_key)
        return ns is not None and ns.online

    def evaluable(self, ent: Entity) -> bool:
        """Whether `ent`'s node is known and online, so that `ent` can be evaluated now. One that is offline is
        marked to be evaluated in full when it is back: what is skipped now (a snooze or exemption that ended, a
        sweep, a deadline) is not lost."""
        ns = self.nodes.get(ent.node_key)
        if ns is None:
            return False
        if not ns.online:
            ns.skipped()
        return ns.online

    @property
    def offline_keys(self) -> AbstractSet[str]:
        """Read only: the keys of the known nodes that are offline."""
        return self._offline

    @property
    def any_offline(self) -> bool:
        """Whether some known node is offline."""
        return bool(self._offline)

    def set_online(self, ns: NodeState, online: bool, now: datetime) -> None:
        self._touched[ns.key] = None
        ns.online = online
        ns.offline_since = None if online else (ns.offline_since or now)
        if online:
            self._offline.discard(ns.key)
        else:
            self._offline.add(ns.key)
        if ns.node_entity is not None:
            ns.node_entity.view.online = online and not ns.stopping


def _allocation(snap: NodeSnapshot) -> dict[int, str] | None:
    """GPU index -> the job it is allocated to, from the snapshot's jobs; None when it lists no jobs."""
    if not snap.jobs:
        return None
    return {i: j.id for j in snap.jobs for i in j.gpus}


def _allocated(g: GpuInfo, allocation: dict[int, str] | None) -> GpuInfo:
    """`allocated`/`job` as the jobs say, where the agent did not say itself."""
    if allocation is None or g.allocated is not None:
        return g
    job = allocation.get(g.index)
    return replace(g, allocated=job is not None, job=job)
