"""Build a node's views and entities from its infos, and keep them up to date field by field.

A node seen for the first time, or whose own fields or online state changed, or marked `full_next`, is built
anew and every entity is reported (with no delta: evaluate everything). Otherwise the views are patched in
place: each field that changed is set on the view that shows it, and every entity whose context shows a
changed field is reported with the names of the fields that changed (its delta), so the core evaluates only
the rules that read one of them. `idle_for_s` and `age_s` only move with time (time-dependent rules are
evaluated on ticks and for the node's every event). This runs for every changing snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from datetime import datetime, timedelta
from operator import attrgetter, is_
from typing import Any

import msgspec

from gpuevents.agentdata import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo
from gpuevents.holding import parted_uuids
from rules.core.state.node import Change, Entity, NodeState
from rules.lang.expr import CLOCK_KEY
from rules.lang.views import GPU_FIELDS, PROCESS_FIELDS, EntityView, EvalClock, GpuView, NodeView, ProcessView


def _fields_getter(struct: type[msgspec.Struct], ignore: frozenset[str]) -> Callable[[Any], tuple[Any, ...]]:
    """The values of `struct`'s fields but `ignore`, as one tuple, to tell whether a snapshot repeats itself."""
    return attrgetter(*(k for k in struct.__struct_fields__ if k not in ignore))


DIAG_FIELDS = tuple(f for f in NodeInfo.__struct_fields__ if f.startswith("diag_"))
_node_fields = _fields_getter(NodeInfo, frozenset({"online", "last_seen"}))
_gpu_fields = _fields_getter(GpuInfo, frozenset({"idle_for_s"}))
_process_fields = _fields_getter(ProcessInfo, frozenset({"age_s"}))

GPU_COPIED = tuple(sorted(f for f in GPU_FIELDS & set(GpuInfo.__struct_fields__)
                          if f not in {"index", "node", "mem_pct", "pids", "owners", "owner", "idle_for_s"}))
"""GPU fields a view shows as the agent reported them; the others are derived (`mem_pct` when not reported,
`pids`, `processes`, `owners`, `owner`)."""
PROCESS_COPIED = tuple(sorted(f for f in PROCESS_FIELDS & set(ProcessInfo.__struct_fields__)
                              if f not in {"node", "owner", "gpus", "labels", "age_s"}))
_gpu_copied = attrgetter(*GPU_COPIED)
_process_copied = attrgetter(*PROCESS_COPIED)


def _gpu_raw(g: GpuInfo, t: datetime) -> tuple[Any, ...]:
    """A GPU's inputs; when its idle start is derived from `idle_for_s` (no `idle_since`), that start as of the
    event's time `t` counts, as `FleetState` derives it: a repeat 30 minutes later with the same `idle_for_s` is
    another start."""
    if g.idle and g.idle_since is None and g.idle_for_s is not None:
        return (*_gpu_fields(g), t - timedelta(seconds=g.idle_for_s))
    return _gpu_fields(g)


def timed(snap: NodeSnapshot) -> bool:
    """Whether the snapshot's signature depends on its time (a GPU's idle start derived from `idle_for_s`)."""
    return any(g.idle and g.idle_since is None and g.idle_for_s is not None for g in snap.gpus)


def same_inputs(old: NodeSnapshot, old_t: datetime, new: NodeSnapshot, t: datetime) -> bool:
    """Whether two snapshots, at their times, have the same inputs, times aside: such snapshots build equal views.
    Compared part by part, the cheapest first, up to the first difference (a changing snapshot's first GPU)."""
    if _node_fields(old.node) != _node_fields(new.node) or len(old.gpus) != len(new.gpus) or len(
        old.processes) != len(new.processes) or tuple(old.jobs) != tuple(new.jobs):
        return False
    for a, b in zip(old.gpus, new.gpus, strict=True):
        if _gpu_raw(a, old_t) != _gpu_raw(b, t):
            return False
    return all(a is b or _process_fields(a) == _process_fields(b)
               for a, b in zip(old.processes, new.processes, strict=True))


_MEMBERSHIP = frozenset({"gpus", "owner", "create_time"})
"""Process changes that move it between GPUs' lists (or reorder them, or change their owners); a GPU's own `pids`
and `owners` (what the agent says of a GPU with no process attributed) count too."""


_NONE: frozenset[str] = frozenset()
"""No field changed (shared: never modified)."""


def _same_items(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(map(is_, a, b))


def rebuild(ns: NodeState, clock: EvalClock, owners: Mapping[str, str],
            by_kind: dict[str, dict[str, Entity]]) -> Change:
    """Bring the node's views up to date with its infos; report what is new or changed (with deltas) and what
    is gone (and update the fleet's entity tables `by_kind`)."""
    online = ns.online and not ns.stopping
    node_sig = (_node_fields(ns.info), online)
    full = ns.take_full() or ns.node_entity is None or node_sig != ns.node_sig
    ns.node_sig = node_sig
    if full:
        return _build_all(ns, clock, owners, by_kind, online)
    return _patch(ns, clock, owners, by_kind)


def _counts(ns: NodeState) -> tuple[int, int, int]:
    info, gpu_infos = ns.info, ns.gpu_infos
    n_idle = sum(1 for g in gpu_infos.values() if g.idle)
    if not gpu_infos:
        return info.gpu_count or 0, info.gpus_busy or 0, info.gpus_idle or 0
    n_unknown = sum(1 for g in gpu_infos.values() if not g.idle and not g.activity_known)  # never busy
    return len(gpu_infos), len(gpu_infos) - n_idle - n_unknown, n_idle


def _owner(p: ProcessInfo, owners: Mapping[str, str]) -> str | None:
    return p.owner or (owners.get(p.user, p.user) if p.user else None)


def _new_process(ns: NodeState, pkey: str, p: ProcessInfo, clock: EvalClock,
                 owners: Mapping[str, str]) -> ProcessView:
    return ProcessView(clock, id=pkey.split("@", 1)[0], node=ns.name, owner=_owner(p, owners), gpus=list(p.gpus),
                       labels=dict(p.labels), **{f: getattr(p, f) for f in PROCESS_COPIED})


def _on_gpu(idx: int, g: GpuInfo, pids_of: dict[int, list[int]], by_pid: dict[int, ProcessView],
            ) -> tuple[list[int], list[ProcessView], list[str]]:
    """A GPU's pids (the agent's and those of processes that say they use it), its process views (oldest first)
    and their distinct owners."""
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
    return pids, on_gpu, gpu_owners


def _mem_pct(g: GpuInfo) -> float | None:
    if g.mem_pct is None and g.mem_used_mib is not None and g.mem_total_mib:
        return 100.0 * g.mem_used_mib / g.mem_total_mib
    return g.mem_pct


def _new_gpu(ns: NodeState, idx: int, g: GpuInfo, clock: EvalClock, parents: AbstractSet[str], pids: list[int],
             on_gpu: list[ProcessView], gpu_owners: list[str]) -> GpuView:
    gv = GpuView(clock, id=f"{ns.key}/gpu{idx}", node=ns.name, index=idx, mem_pct=_mem_pct(g), pids=pids,
                 processes=on_gpu, owners=gpu_owners, owner=gpu_owners[0] if gpu_owners else (g.owner or None),
                 **{f: getattr(g, f) for f in GPU_COPIED})
    gv._parted = g.uuid in parents
    return gv


def _attribution(ns: NodeState, procs: dict[str, ProcessView]) -> tuple[dict[int, list[int]], dict[int, ProcessView]]:
    pids_of: dict[int, list[int]] = {}
    by_pid: dict[int, ProcessView] = {}
    for pv in procs.values():
        by_pid[pv.pid] = pv
        for i in pv.gpus:
            pids_of.setdefault(i, []).append(pv.pid)
    return pids_of, by_pid


def _diag(info: NodeInfo) -> dict[str, Any]:
    """The node's diagnostic fields (`node.diag_status`, ...), as its agent reported them."""
    return {k: getattr(info, k) for k in DIAG_FIELDS}


def _build_all(ns: NodeState, clock: EvalClock, owners: Mapping[str, str], by_kind: dict[str, dict[str, Entity]],
               online: bool) -> Change:
    """Every view and entity of the node anew; every entity reported, with no delta."""
    info = ns.info
    count, busy, idle = _counts(ns)
    node_view = NodeView(
        id=ns.key, name=ns.name, cluster=ns.cluster, labels=dict(info.labels), gpu_count=count, gpus_busy=busy,
        gpus_idle=idle, online=online, last_seen=ns.last_seen, cordoned=info.cordoned,
        driver_version=info.driver_version, hostname=info.hostname, **_diag(info),
    )
    procs = {pkey: _new_process(ns, pkey, p, clock, owners) for pkey, p in ns.proc_infos.items()}
    pids_of, by_pid = _attribution(ns, procs)
    gpus: dict[int, GpuView] = {}
    parents = parted_uuids(ns.gpu_infos.values())
    for idx in sorted(ns.gpu_infos):
        g = ns.gpu_infos[idx]
        gpus[idx] = _new_gpu(ns, idx, g, clock, parents, *_on_gpu(idx, g, pids_of, by_pid))
    nkey = ns.key
    gpu_list = list(gpus.values())
    node_ent = Entity(nkey, nkey, "node", nkey, node_view, {
        "node": node_view, "gpus": gpu_list, "entity": EntityView(nkey, "node", ns.name, ns.cluster), CLOCK_KEY: clock,
    })
    new: dict[str, Entity] = {nkey: node_ent}
    for gv in gpu_list:
        new[gv.id] = Entity(gv.id, gv.id, "gpu", nkey, gv, {
            "gpu": gv, "node": node_view, "entity": EntityView(gv.id, "gpu", ns.name, ns.cluster), CLOCK_KEY: clock,
        })
    for pkey, pv in procs.items():
        new[pkey] = Entity(pkey, pv.id, "process", nkey, pv, {
            "process": pv, "node": node_view, "gpus": [gpus[i] for i in pv.gpus if i in gpus],
            "entity": EntityView(pv.id, "process", ns.name, ns.cluster), CLOCK_KEY: clock,
        })
    return _install(ns, new, node_ent, gpu_list, list(new.values()), {}, by_kind)


def _install(ns: NodeState, new: dict[str, Entity], node_ent: Entity, gpu_list: list[GpuView],
             changed: list[Entity], deltas: dict[str, frozenset[str]], by_kind: dict[str, dict[str, Entity]]) -> Change:
    """Make `new` the node's entities: the fleet's tables lose the gone ones and take the changed ones."""
    gone = [e for k, e in ns.entities.items() if k not in new]
    for e in gone:
        by_kind[e.kind].pop(e.key, None)
    for e in changed:
        by_kind[e.kind][e.key] = e
    ns.entities = new
    ns.node_entity = node_ent
    ns.gpu_views = gpu_list
    ns.view_gpu_infos = dict(ns.gpu_infos)
    ns.view_proc_infos = dict(ns.proc_infos)
    return Change(ns.key, changed, gone, deltas)


def _patch(ns: NodeState, clock: EvalClock, owners: Mapping[str, str],
           by_kind: dict[str, dict[str, Entity]]) -> Change:
    """Set what changed on the views that show it; report the entities whose context shows a change."""
    nkey = ns.key
    old_entities = ns.entities
    node_ent = ns.node_entity
    assert node_ent is not None
    node_view: NodeView = node_ent.view
    node_view.last_seen = ns.last_seen
    node_delta: set[str] = set()
    count, busy, idle = _counts(ns)
    for name, value in (("gpu_count", count), ("gpus_busy", busy), ("gpus_idle", idle)):
        if getattr(node_view, name) != value:
            setattr(node_view, name, value)
            node_delta.add(name)
    # processes
    old_pinfos = ns.view_proc_infos
    procs: dict[str, ProcessView] = {}
    proc_delta: dict[str, set[str] | None] = {}
    for pkey, p in ns.proc_infos.items():
        old_ent = old_entities.get(pkey)
        old_p = old_pinfos.get(pkey)
        if old_ent is None or old_p is None:
            procs[pkey] = _new_process(ns, pkey, p, clock, owners)
            proc_delta[pkey] = None
            continue
        pv = old_ent.view
        procs[pkey] = pv
        if p is old_p:
            continue
        d = _patch_process(pv, old_p, p, owners)
        if d:
            proc_delta[pkey] = d
    old_ginfos = ns.view_gpu_infos
    # Who is on which GPU only moves when a process comes, goes, changes GPUs, owner or start, or a GPU's pids
    # change: otherwise every GPU keeps its lists (the common case of readings that move).
    same_members = old_pinfos.keys() == ns.proc_infos.keys() and old_ginfos.keys() == ns.gpu_infos.keys() and all(
        d is not None and not d & _MEMBERSHIP for d in proc_delta.values()) and all(
        g is (o := old_ginfos[i]) or (g.pids == o.pids and g.owners == o.owners) for i, g in ns.gpu_infos.items())
    pids_of, by_pid = _attribution(ns, procs) if not same_members else ({}, {})
    key_of = {id(v): k for k, v in procs.items()}
    # GPUs
    gpus: dict[int, GpuView] = {}
    gpu_delta: dict[int, set[str] | None] = {}
    parents = parted_uuids(ns.gpu_infos.values())
    for idx in sorted(ns.gpu_infos):
        g = ns.gpu_infos[idx]
        old_ent = old_entities.get(f"{nkey}/gpu{idx}")
        old_g = old_ginfos.get(idx)
        if old_ent is None or old_g is None:
            if same_members:  # (not expected: a new GPU changes the members)
                pids_of, by_pid = _attribution(ns, procs)
                same_members = False
            gpus[idx] = _new_gpu(ns, idx, g, clock, parents, *_on_gpu(idx, g, pids_of, by_pid))
            gpu_delta[idx] = None
            continue
        gv = old_ent.view
        gpus[idx] = gv
        attributed = (gv.pids, gv.processes, gv.owners) if same_members else _on_gpu(idx, g, pids_of, by_pid)
        d = _patch_gpu(gv, old_g, g, parents, *attributed)
        for pv in gv.processes:  # the GPU shows its processes: their changes are its changes
            pd = proc_delta.get(key_of[id(pv)], _NONE)
            if pd is None:
                d.add("processes")
            elif pd:
                d |= pd
        if d:
            gpu_delta[idx] = d
    # entities
    gpu_list = list(gpus.values())
    gpus_moved = not _same_items(ns.gpu_views, gpu_list)
    changed: list[Entity] = []
    deltas: dict[str, frozenset[str]] = {}
    new: dict[str, Entity] = {nkey: node_ent}
    all_gpu_changes: set[str] = set(node_delta)
    for idx, gv in gpus.items():
        key = gv.id
        delta = gpu_delta.get(idx, _NONE)
        if delta is None:
            ent = Entity(key, key, "gpu", nkey, gv, {
                "gpu": gv, "node": node_view, "entity": EntityView(key, "gpu", ns.name, ns.cluster), CLOCK_KEY: clock,
            })
            changed.append(ent)
            all_gpu_changes.add("gpus")
        else:
            ent = old_entities[key]
            d = node_delta | delta
            if d:
                changed.append(ent)
                deltas[key] = frozenset(d)
                all_gpu_changes |= d
        new[key] = ent
    if gpus_moved:
        node_ent.ctx["gpus"] = gpu_list
        all_gpu_changes.add("gpus")
    if all_gpu_changes:
        changed.insert(0, node_ent)
        deltas[nkey] = frozenset(all_gpu_changes)
    for pkey, pv in procs.items():
        delta = proc_delta.get(pkey, _NONE)
        pgpus = ([gpus[i] for i in pv.gpus if i in gpus]
                 if delta is None or not (same_members and not gpus_moved) else [])
        if delta is None:
            ent = Entity(pkey, pv.id, "process", nkey, pv, {
                "process": pv, "node": node_view, "gpus": pgpus,
                "entity": EntityView(pv.id, "process", ns.name, ns.cluster), CLOCK_KEY: clock,
            })
            changed.append(ent)
        else:
            ent = old_entities[pkey]
            d = node_delta | delta
            if not (same_members and not gpus_moved) and not _same_items(ent.ctx["gpus"], pgpus):
                ent.ctx["gpus"] = pgpus
                d.add("gpus")
            for i in pv.gpus:  # the process shows its GPUs
                gd = gpu_delta.get(i, _NONE)
                d |= gd if gd is not None else {"gpus"}
            if d:
                changed.append(ent)
                deltas[pkey] = frozenset(d)
        new[pkey] = ent
    return _install(ns, new, node_ent, gpu_list, changed, deltas, by_kind)


def _patch_process(pv: ProcessView, old: ProcessInfo, p: ProcessInfo, owners: Mapping[str, str]) -> set[str]:
    d: set[str] = set()
    for f, v, was in zip(PROCESS_COPIED, _process_copied(p), _process_copied(old), strict=True):
        if v != was:
            setattr(pv, f, v)
            d.add(f)
    if "create_time" in d:
        pv._create_ts = p.create_time.timestamp()
    if p.owner != old.owner or "user" in d:
        owner = _owner(p, owners)
        if owner != pv.owner:
            pv.owner = owner
            d.add("owner")
    if p.gpus != old.gpus:
        pv.gpus = list(p.gpus)
        d.add("gpus")
    if p.labels != old.labels:
        pv.labels = dict(p.labels)
        d.add("labels")
    return d


def _patch_gpu(gv: GpuView, old: GpuInfo, g: GpuInfo, parents: AbstractSet[str], pids: list[int],
               on_gpu: list[ProcessView], gpu_owners: list[str]) -> set[str]:
    d: set[str] = set()
    if g is not old:
        new_vals, old_vals = _gpu_copied(g), _gpu_copied(old)
        if new_vals != old_vals:
            for f, v, was in zip(GPU_COPIED, new_vals, old_vals, strict=True):
                if v != was:
                    setattr(gv, f, v)
                    d.add(f)
        if "idle_since" in d:
            gv._idle_since_ts = g.idle_since.timestamp() if g.idle_since is not None else None
        mem_pct = _mem_pct(g)
        if mem_pct != gv.mem_pct:
            gv.mem_pct = mem_pct
            d.add("mem_pct")
    if pids != gv.pids:
        gv.pids = pids
        d.add("pids")
    if not _same_items(gv.processes, on_gpu):
        gv.processes = on_gpu
        d.add("processes")
    if gpu_owners != gv.owners:
        gv.owners = gpu_owners
        d.add("owners")
    parted = g.uuid in parents
    if parted != gv._parted:
        gv._parted = parted
        d.add("held_idle")
    owner = gpu_owners[0] if gpu_owners else (g.owner or None)
    if owner != gv.owner:
        gv.owner = owner
        d.add("owner")
    return d
