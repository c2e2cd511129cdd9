"""The status summary kept as aggregates: each node's counts (GPUs busy, idle, held idle, unknown; the money held
idle) are worked out once per change of its readings and kept, so that answering `gpuevents status` adds up kept
numbers instead of building every node's view and JSON; only the incidents it shows are rendered."""

from __future__ import annotations

import heapq
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, TypeVar

from gpuevents.agentdata import GpuInfo, NodeInfo
from gpuevents.costs import CostModel, physical_shares
from gpuevents.holding import held_idle
from gpuevents.wire.fleet import FleetSummary, WorstNode
from gpuevents.wire.status import TOP
from rules.core.core import Core
from rules.engine.read import readings
from rules.engine.read.readmodel import ReadModel, incident_cost, incident_view
from rules.engine.read.slices import Packed, Slicer

T = TypeVar("T")
CHECK = 32  # nodes or incidents between two looks at the slicer's clock (each at most ~20 µs of work)


@dataclass(frozen=True, slots=True)
class NodeCounts:
    """One node's part of the summary, and the readings it was counted from (immutable: compared by identity,
    held weakly so that a reading the core has replaced is freed)."""

    info: Callable[[], NodeInfo | None]
    online: bool
    gpu_infos: tuple[Callable[[], GpuInfo | None], ...]
    cluster: str
    name: str
    gpus: int
    idle: int
    unknown: int
    held: int
    held_cost: float


def count_node(gpu_infos: Iterable[GpuInfo], online: bool, costs: CostModel) -> tuple[int, int, int, int, float]:
    """A node's GPUs, idle, unknown (no activity signal), held idle (gpuevents/holding.py), and money held idle
    per hour, as the dashboard's view of it (rules/dashboard/fleet_view.py) counts them: a MIG parent whose
    instances are reported is left out, an instance costs its share."""
    gpus = idle = unknown = held = 0
    held_cost = 0.0
    physical = physical_shares(gpu_infos)
    for g in sorted(gpu_infos, key=lambda g: g.index):
        if not physical[g.index]:
            continue
        gpus += 1
        idle += g.idle
        unknown += not g.idle and not g.activity_known
        if held_idle(g, online=online):
            held += 1
            held_cost += costs.hourly(g.model, g.power_w) * physical[g.index]
    return gpus, idle, unknown, held, held_cost


@dataclass(slots=True)
class _Tally:
    """The summary's numbers while they are added up."""

    nodes: int = 0
    nodes_online: int = 0
    gpus: int = 0
    busy: int = 0
    idle: int = 0
    unknown: int = 0
    held_idle: int = 0
    held_idle_cost_per_hour: float = 0.0
    incidents_firing: int = 0
    incidents_pending: int = 0


class FleetAggregates:
    """Each node's counts, kept between status requests and worked out again only for the nodes whose readings
    changed (the core replaces a reading whole when it changes, so a kept one still there means no change)."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeCounts] = {}
        self._costs: Any = None  # the cost settings the kept counts were made with

    def counts(self, core: Core, key: str, costs: CostModel) -> NodeCounts | None:
        ns = core.state.nodes.get(key)
        if ns is None:
            self._nodes.pop(key, None)
            return None
        gpu_infos = tuple(ns.gpu_infos.values())
        kept = self._nodes.get(key)
        if kept is not None and kept.online == ns.online and _same(kept, ns.info, gpu_infos):
            return kept
        gpus, idle, unknown, held, held_cost = count_node(gpu_infos, ns.online, costs)
        counts = NodeCounts(info=_ref(ns.info), online=ns.online, gpu_infos=tuple(_ref(g) for g in gpu_infos),
                            cluster=ns.info.cluster, name=ns.info.name, gpus=gpus, idle=idle, unknown=unknown,
                            held=held, held_cost=held_cost)
        self._nodes[key] = counts
        return counts

    async def summary(self, core: Core, now: datetime, version: int, costs: CostModel,
                      slicer: Slicer | None = None, warnings: tuple[str, ...] = ()) -> ReadModel:
        """A read model with the summary, the worst nodes and the TOP firing incidents only (no node or incident
        pages): the same numbers and rankings as a full build of the same fleet."""
        started = time.perf_counter()
        slicer = slicer or Slicer(freeze=True)
        if self._costs is not costs.costs:
            self._nodes.clear()
            self._costs = costs.costs
        t = _Tally()  # plain attributes: a pydantic model's cost 30 times over per node and incident
        worst: list[tuple[int, float, int, int, NodeCounts]] = []
        clusters: Counter[str] = Counter()
        keys = readings.node_keys(core)
        for gone in self._nodes.keys() - set(keys):
            del self._nodes[gone]
        for n, key in enumerate(keys):
            if n % CHECK == 0 and slicer.due():
                await slicer.pause()
            c = self.counts(core, key, costs)
            if c is None:
                continue
            clusters[c.cluster] += 1
            t.nodes += 1
            t.nodes_online += c.online
            t.gpus += c.gpus
            t.idle += c.idle
            t.busy += c.gpus - c.idle - c.unknown
            t.unknown += c.unknown
            t.held_idle += c.held
            t.held_idle_cost_per_hour += c.held_cost
            if c.held:
                entry = (c.held, c.held_cost, c.idle, -n, c)
                if len(worst) < TOP:
                    heapq.heappush(worst, entry)
                elif entry[:4] > worst[0][:4]:
                    heapq.heapreplace(worst, entry)
        # the TOP firing incidents, most costly then the longest firing, then in the order read: a min-heap of
        # (cost, -since, -order), the first of it the least of those kept
        costliest: list[tuple[float, float, int, Any]] = []
        for group in readings.open_incidents(core):
            for n, inc in enumerate(group):
                if n % CHECK == 0 and slicer.due():
                    await slicer.pause()
                if inc.status != "firing":
                    t.incidents_pending += 1
                    continue
                t.incidents_firing += 1
                hit = (incident_cost(core, inc, now, costs) or 0.0, -(inc.fired_at or inc.active_at).timestamp(),
                       -t.incidents_firing, inc)
                if len(costliest) < TOP:
                    heapq.heappush(costliest, hit)
                elif hit[:3] > costliest[0][:3]:
                    heapq.heapreplace(costliest, hit)
        s = FleetSummary(time=now, currency=costs.currency,
                         held_idle_cost_per_hour_text=costs.format(t.held_idle_cost_per_hour), **asdict(t))
        top = Packed()
        for *_k, inc in sorted(costliest, key=lambda e: e[:3], reverse=True):
            top.append(incident_view(core, inc, now, costs).model_dump_json().encode())
        ranked = sorted(worst, key=lambda e: e[:4], reverse=True)
        return ReadModel(
            version=version, time=now, summary=s, team_label=costs.costs.team_label, incidents=top.done(),
            worst_nodes=tuple(WorstNode(name=c.name, cluster=c.cluster, online=c.online, gpus=c.gpus, idle=c.idle,
                                        held_idle=c.held, held_idle_cost_per_hour=c.held_cost)
                              for *_k, c in ranked),
            clusters=dict(clusters), demand=tuple(readings.demand_lines(core, now)),
            exemptions=tuple(readings.exemption_views(core, now)), warnings=warnings, summary_only=True,
            built_s=time.perf_counter() - started)


def _same(kept: NodeCounts, info: NodeInfo, gpus: tuple[GpuInfo, ...]) -> bool:
    """The same readings, each the very object counted before."""
    return kept.info() is info and len(kept.gpu_infos) == len(gpus) and all(
        a() is b for a, b in zip(kept.gpu_infos, gpus, strict=True))


def _ref(reading: T) -> Callable[[], T | None]:
    """A weak reference to a reading, or a strong one for a type that takes none."""
    try:
        return weakref.ref(reading)
    except TypeError:
        return lambda: reading
