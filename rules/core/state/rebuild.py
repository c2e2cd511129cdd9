"""Build a node's views and entities from its infos, keeping those whose inputs did not change.

A view whose inputs equal the ones it was built from (ignoring `idle_for_s` and `age_s`, which only move with
time) is kept, and so is its entity; only new and changed entities are reported, since a condition can only
change when its inputs do (time-dependent ones are re-swept on ticks). A change to the node's own fields, its
online state, or `full_next` set rebuilds and reports everything. This runs for every changing snapshot: the
parts below are called once per node, their loops are per entity.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from operator import itemgetter
from typing import Any

from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo
from rules.core.state.node import Change, Entity, NodeState
from rules.lang.expr import CLOCK_KEY
from rules.lang.views import EntityView, EvalClock, GpuView, NodeView, ProcessView


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


def snapshot_sig(snap: NodeSnapshot) -> tuple[Any, ...]:
    """A snapshot's inputs, times aside: equal signatures build equal views."""
    return (
        _node_fields(snap.node), tuple(map(_gpu_raw, snap.gpus)), tuple(map(_process_fields, snap.processes)),
    )


def _same_items(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def rebuild(ns: NodeState, clock: EvalClock, owners: Mapping[str, str],
            by_kind: dict[str, dict[str, Entity]]) -> Change:
    """Build the node's views from its infos; report what is new or changed and what is gone (and update the
    fleet's entity tables `by_kind`)."""
    node_view, full = _node_view(ns)
    fresh: set[int] = set()  # ids of views built now
    procs, by_pid = _process_views(ns, full, clock, owners, fresh)
    gpus = _gpu_views(ns, full, clock, procs, by_pid, fresh)
    return _entities(ns, full, clock, node_view, procs, gpus, fresh, by_kind)


def _node_view(ns: NodeState) -> tuple[NodeView, bool]:
    """The node's view, and whether everything is rebuilt (its inputs changed, or it is new or `full_next`)."""
    info = ns.info
    gpu_infos = ns.gpu_infos
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
        ns.node_sig = node_sig
        return NodeView(
            id=ns.key, name=ns.name, cluster=ns.cluster, labels=dict(info.labels), gpu_count=node_sig[1],
            gpus_busy=node_sig[2], gpus_idle=node_sig[3], online=online, last_seen=ns.last_seen,
            cordoned=info.cordoned, driver_version=info.driver_version, hostname=info.hostname,
        ), True
    assert old_node is not None
    node_view: NodeView = old_node.view
    node_view.last_seen = ns.last_seen
    return node_view, False


def _process_views(
    ns: NodeState, full: bool, clock: EvalClock, owners: Mapping[str, str], fresh: set[int],
) -> tuple[dict[str, ProcessView], dict[int, ProcessView]]:
    """The process views by entity key and by pid; those built now are added to `fresh`."""
    old_entities = ns.entities
    old_psigs = ns.proc_sigs
    new_psigs: dict[str, tuple[Any, ...]] = {}
    procs: dict[str, ProcessView] = {}
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
    return procs, by_pid


def _gpu_views(
    ns: NodeState, full: bool, clock: EvalClock, procs: dict[str, ProcessView], by_pid: dict[int, ProcessView],
    fresh: set[int],
) -> dict[int, GpuView]:
    """The GPU views by index, with the processes on each (reported by the GPU or by the process); those
    built now are added to `fresh`."""
    nkey = ns.key
    gpu_infos = ns.gpu_infos
    old_entities = ns.entities
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
            mig_parent=g.mig_parent, lost=g.lost, xid=g.xid, xid_at=g.xid_at,
        )
        fresh.add(id(gv))
    ns.gpu_sigs = new_gsigs
    return gpus


def _entities(
    ns: NodeState, full: bool, clock: EvalClock, node_view: NodeView, procs: dict[str, ProcessView],
    gpus: dict[int, GpuView], fresh: set[int], by_kind: dict[str, dict[str, Entity]],
) -> Change:
    """The node's entities: a new one (with its context) for each view built now or whose context changed,
    the old one otherwise; the fleet's tables and the node state take them, and the change says which."""
    nkey = ns.key
    old_entities = ns.entities
    old_node = ns.node_entity
    gpu_list = list(gpus.values())
    new: dict[str, Entity] = {}
    changed: list[Entity] = []
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
