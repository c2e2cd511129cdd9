"""The read model: an immutable picture of the fleet that status, the dashboard and `free` answer from, built in
slices of a few milliseconds between the engine's events, so that reading the fleet never stops consuming it."""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from gpuevents.aio import guarded_task
from gpuevents.costs import CostModel
from gpuevents.wire.fleet import DemandLine, ExemptionView, FleetIncident, FleetNode, FleetSummary, WorstNode
from gpuevents.wire.status import TOP
from rules.core.core import Core
from rules.dashboard.fleet_view import FleetRows, fleet_node
from rules.engine.read import readings
from rules.engine.read.slices import Packed, Slicer, add, sorted_sliced

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadModel:
    """The fleet as of `time`, built from the core's state at `version` (the engine's count of changes) or later.
    Immutable: readers share it, and a new one replaces it whole. Nodes and incidents are held as JSON packed
    into few objects: little for the garbage collector to walk or for freeing an old model to do, and pages
    are served without serialising anything again."""

    version: int
    time: datetime
    summary: FleetSummary
    team_label: str = "team"
    node_keys: tuple[tuple[str, str], ...] = ()  # (cluster, name), in that order
    node_json: Packed = field(default_factory=Packed)  # each node's FleetNode, in the order of node_keys
    incidents: Packed = field(default_factory=Packed)  # open ones (FleetIncident): firing first, most costly,
    # then the longest open
    worst_nodes: tuple[WorstNode, ...] = ()  # most GPUs held idle first (only nodes with some), at most TOP
    node_index: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # node name -> positions in nodes
    incident_index: Mapping[str, Sequence[int]] = field(default_factory=dict)  # node name -> in incidents
    firing_cost: Sequence[float] = ()  # each firing incident's cost so far, to merge several models by
    firing_since: Sequence[float] = ()  # and when it fired (a timestamp)
    demand: tuple[DemandLine, ...] = ()  # what the schedulers report as waiting, still valid at `time`
    warnings: tuple[str, ...] = ()  # what the engine cannot set right itself: a node two agents claim
    exemptions: tuple[ExemptionView, ...] = ()  # jobs exempt by their annotations; malformed ones
    built_s: float = 0.0  # how long the build took, slices and pauses included

    def firing(self) -> list[bytes]:
        return self.incidents.range(0, self.summary.incidents_firing)

    def top_firing(self, n: int) -> list[FleetIncident]:
        """The `n` most costly firing incidents (then the longest firing)."""
        return [FleetIncident.model_validate_json(raw) for raw in self.incidents.range(0, min(
            n, self.summary.incidents_firing))]

    def fleet_rows(self) -> FleetRows:
        """The dashboard's view of the fleet: the counts, and each node's JSON as it is held."""
        s = self.summary
        return FleetRows(time=self.time, currency=s.currency, team_label=self.team_label,
                         held_idle_cost_per_hour=s.held_idle_cost_per_hour,
                         held_idle_cost_per_hour_text=s.held_idle_cost_per_hour_text, gpu_count=s.gpus,
                         busy=s.busy, idle=s.idle, held_idle=s.held_idle, node_json=self.node_json,
                         demand=self.demand)

    def node(self, name: str) -> tuple[list[FleetNode], list[FleetIncident]]:
        """The node(s) of that name (one per cluster) and their open incidents."""
        return ([FleetNode.model_validate_json(self.node_json[i]) for i in self.node_index.get(name, ())],
                [FleetIncident.model_validate_json(self.incidents[i]) for i in self.incident_index.get(name, ())])


def _incident_key(inc: FleetIncident) -> tuple[int, float, datetime]:
    return (0 if inc.status == "firing" else 1, -(inc.cost_value or 0.0), inc.firing_since or inc.started_at)


async def build_read_model(core: Core, now: datetime, version: int, costs: CostModel,
                           slicer: Slicer | None = None, warnings: tuple[str, ...] = ()) -> ReadModel:
    """Read the core a slice at a time (each node and incident whole, between two events) into a ReadModel."""
    model = await _build(core, now, version, costs, slicer or Slicer(freeze=True))
    return replace(model, warnings=warnings)


async def _build(core: Core, now: datetime, version: int, costs: CostModel, slicer: Slicer) -> ReadModel:
    started = time.perf_counter()
    team_label = costs.costs.team_label
    rows: list[list[tuple[str, str, bytes]]] = []
    s = FleetSummary(time=now, currency=costs.currency)
    worst: list[tuple[int, float, int, int, WorstNode]] = []  # a min-heap of the TOP worst so far
    for n, key in enumerate(readings.node_keys(core)):
        if slicer.due():
            await slicer.pause()
        snap = readings.node_reading(core, key)
        if snap is None:
            continue
        node, held_cost = fleet_node(snap, costs, team_label, now)
        add(rows, (node.cluster, node.name, node.model_dump_json().encode()))
        idle = sum(1 for g in node.gpus if g.idle)
        unknown = sum(1 for g in node.gpus if not g.idle and not g.activity_known)
        held = sum(1 for g in node.gpus if g.held_idle)
        s.nodes += 1
        s.nodes_online += node.online
        s.gpus += len(node.gpus)
        s.idle += idle
        s.busy += len(node.gpus) - idle - unknown
        s.unknown += unknown
        s.held_idle += held
        s.held_idle_cost_per_hour += held_cost
        if held:
            w = WorstNode(name=node.name, cluster=node.cluster, online=node.online, gpus=len(node.gpus),
                          idle=idle, held_idle=held, held_idle_cost_per_hour=held_cost)
            entry = (held, held_cost, idle, -n, w)
            if len(worst) < TOP:
                heapq.heappush(worst, entry)
            elif entry[:4] > worst[0][:4]:
                heapq.heapreplace(worst, entry)
    s.held_idle_cost_per_hour_text = costs.format(s.held_idle_cost_per_hour)
    node_keys: list[tuple[str, str]] = []
    node_json = Packed()
    node_index: dict[str, tuple[int, ...]] = {}
    i = 0
    async for cluster, name, raw in sorted_sliced(rows, lambda r: (r[0], r[1]), slicer):
        node_keys.append((cluster, name))
        node_json.append(raw)
        node_index[name] = (*node_index.get(name, ()), i)
        i += 1
    found: list[list[tuple[tuple[int, float, datetime], str, bytes]]] = []
    for group in readings.open_incidents(core):
        for inc in group:
            if slicer.due():
                await slicer.pause()
            view = _incident_view(core, inc, now, costs)
            add(found, (_incident_key(view), inc.node, view.model_dump_json().encode()))
    incidents = Packed()
    firing_cost, firing_since = array("d"), array("d")
    incident_index: dict[str, array[int]] = {}
    i = 0
    async for k, name, raw in sorted_sliced(found, lambda x: x[0], slicer):
        incidents.append(raw)
        incident_index.setdefault(name, array("Q")).append(i)
        i += 1
        if k[0] == 0:
            s.incidents_firing += 1
            firing_cost.append(k[1])
            firing_since.append(k[2].timestamp())
    s.incidents_pending = len(incidents) - s.incidents_firing
    return ReadModel(
        version=version, time=now, summary=s, team_label=team_label, node_keys=tuple(node_keys),
        node_json=node_json.done(), incidents=incidents.done(),
        worst_nodes=tuple(w for *_k, w in sorted(worst, key=lambda e: e[:4], reverse=True)),
        node_index=node_index, incident_index=incident_index, firing_cost=firing_cost, firing_since=firing_since,
        demand=tuple(readings.demand_lines(core, now)),
        exemptions=tuple(readings.exemption_views(core, now)),
        built_s=time.perf_counter() - started)


def _incident_view(core: Core, inc: Any, now: datetime, costs: CostModel) -> FleetIncident:
    ctx = readings.incident_context(core, inc)
    cost = None
    if inc.entity_kind == "gpu" and inc.fired_at:
        cost = costs.hourly(ctx.model, ctx.power_w) * (now - inc.active_at).total_seconds() / 3600
    return FleetIncident(
        id=inc.id, rule=inc.rule, entity_id=inc.entity_id, entity_kind=inc.entity_kind, cluster=inc.cluster,
        status=inc.status,
        started_at=inc.active_at, firing_since=inc.fired_at, severity=ctx.severity, owner=ctx.owner,
        cost=costs.format(cost) if cost is not None else None, cost_value=cost, warning=ctx.warning)


def empty_model(now: datetime, costs: CostModel, version: int = -1) -> ReadModel:
    return ReadModel(version=version, time=now, summary=FleetSummary(time=now, currency=costs.currency),
                     team_label=costs.costs.team_label)


class ReadSide:
    """Hands readers a read model: the latest, or one built once the changes a reader must see are in. One build
    runs at a time, shared by every reader waiting for it; a reader that gives up does not stop it."""

    def __init__(self, build: Callable[[int], Any], version: Callable[[], int]) -> None:
        self._build = build  # version -> awaitable ReadModel
        self._version = version
        self.latest: ReadModel | None = None
        self._latest_at = 0.0
        self._task: asyncio.Task[ReadModel] | None = None

    async def get(self, max_age_s: float = 0.0) -> ReadModel:
        """A model with every change counted before this call (or, with `max_age_s`, the latest if it is that
        young)."""
        want = self._version()
        while True:
            m = self.latest
            if m is not None and (m.version >= want or time.monotonic() - self._latest_at <= max_age_s):
                return m
            task = self._task if self._task is not None and not self._task.done() else self._start()
            await asyncio.shield(task)

    def refresh(self) -> None:
        """Start building a new model unless one is being built (the engine calls it after each tick)."""
        if self._task is None or self._task.done():
            self._start()

    def _start(self) -> asyncio.Task[ReadModel]:
        self._task = guarded_task(self._run(self._version()), "read model", awaited=True)
        self._task.add_done_callback(_retrieve)
        return self._task

    async def _run(self, version: int) -> ReadModel:
        model: ReadModel = await self._build(version)
        self.latest, self._latest_at = model, time.monotonic()
        return model

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _retrieve(task: asyncio.Task[ReadModel]) -> None:
    """A failed build is raised to the readers that wait for it, and logged (a tick's has no reader)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("the read model could not be built", exc_info=task.exception())
