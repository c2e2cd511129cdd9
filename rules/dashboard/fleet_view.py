"""What the dashboard shows, as JSON API models, and the Protocol the engine implements to feed it."""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from pydantic import BaseModel, computed_field

from gpuevents.agentdata import GpuInfo, NodeInfo, ProcessInfo
from gpuevents.costs import CostModel, physical_shares
from gpuevents.holding import held_idle
from gpuevents.records import AuditRecord
from gpuevents.wire.fleet import DemandLine, FleetGpu, FleetIncident, FleetNode


class FleetView(BaseModel):
    """`GET /api/fleet`: every node and GPU now, with the counts and the money held idle per hour."""

    time: datetime
    currency: str = "USD"
    team_label: str = "team"  # the node (or pod) label that names a team (config costs.team_label)
    nodes: list[FleetNode] = []
    held_idle_cost_per_hour: float = 0.0
    held_idle_cost_per_hour_text: str = ""
    demand: list[DemandLine] = []

    @computed_field  # type: ignore[prop-decorator]  # mypy allows no decorator over @property; pydantic says so
    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    @computed_field  # type: ignore[prop-decorator]  # mypy allows no decorator over @property; pydantic says so
    @property
    def busy(self) -> int:
        return sum(1 for n in self.nodes for g in n.gpus if not g.idle and g.activity_known)

    @computed_field  # type: ignore[prop-decorator]  # mypy allows no decorator over @property; pydantic says so
    @property
    def idle(self) -> int:
        return sum(1 for n in self.nodes for g in n.gpus if g.idle)

    @computed_field  # type: ignore[prop-decorator]  # mypy allows no decorator over @property; pydantic says so
    @property
    def held_idle(self) -> int:
        return sum(1 for n in self.nodes for g in n.gpus if g.held_idle)


@dataclass(frozen=True)
class FleetRows:
    """The fleet as the engine's read model holds it: the counts, and each node's FleetNode as JSON (bytes are
    no work for the garbage collector, and are served as they are). `GET /api/fleet` gives the same JSON as for
    a FleetView."""

    time: datetime
    currency: str = "USD"
    team_label: str = "team"
    held_idle_cost_per_hour: float = 0.0
    held_idle_cost_per_hour_text: str = ""
    gpu_count: int = 0
    busy: int = 0
    idle: int = 0
    held_idle: int = 0
    node_json: Sequence[bytes] = ()
    demand: Sequence[DemandLine] = ()

    def header(self) -> dict[str, object]:
        """Every field of a FleetView but `nodes`, as JSON values."""
        return {"time": self.time.isoformat().replace("+00:00", "Z"), "currency": self.currency,
                "team_label": self.team_label, "held_idle_cost_per_hour": self.held_idle_cost_per_hour,
                "held_idle_cost_per_hour_text": self.held_idle_cost_per_hour_text, "gpu_count": self.gpu_count,
                "busy": self.busy, "idle": self.idle, "held_idle": self.held_idle,
                "demand": [d.model_dump(mode="json") for d in self.demand]}

    def nodes(self, start: int = 0, stop: int | None = None) -> Iterator[FleetNode]:
        """The nodes, parsed one at a time."""
        for raw in self.node_json[start:stop]:
            yield FleetNode.model_validate_json(raw)


class IncidentsResponse(BaseModel):
    incidents: list[FleetIncident]


class AuditResponse(BaseModel):
    records: list[AuditRecord]


class DashboardSource(Protocol):
    """What the engine gives the dashboard. Called on every API request: answer from memory, fast.

    Each method may return its value or an awaitable of it.
    """

    def fleet(self) -> FleetView | FleetRows | Awaitable[FleetView | FleetRows]: ...

    def incidents(self) -> Sequence[FleetIncident | bytes] | Awaitable[Sequence[FleetIncident | bytes]]:
        """The firing incidents, each a FleetIncident or its JSON."""
        ...

    def recent_audit(self, limit: int) -> list[AuditRecord] | Awaitable[list[AuditRecord]]:
        """The newest `limit` audit records, newest first."""
        ...


class NodeReadings(Protocol):
    """A node's readings as fleet_node reads them: a NodeSnapshot, or the engine's own record of one."""

    @property
    def node(self) -> NodeInfo: ...

    @property
    def gpus(self) -> Sequence[GpuInfo]: ...

    @property
    def processes(self) -> Sequence[ProcessInfo]: ...


def fleet_node(snap: NodeReadings, costs: CostModel | None = None, team_label: str = "team",
               now: datetime | None = None) -> tuple[FleetNode, float]:
    """One node as the dashboard shows it, and the money its held-idle GPUs cost per hour. With `now`, each idle
    GPU's `idle_for_s` is counted from its `idle_since` (the engine's view); else it is the snapshot's own."""
    gpus = []
    held_cost = 0.0
    physical = physical_shares(snap.gpus)
    proc_jobs = {p.pid: p.job for p in snap.processes if p.job}
    proc_teams = {p.pid: p.labels[team_label] for p in snap.processes if p.labels.get(team_label)}
    node_team = snap.node.labels.get(team_label) or None
    for g in sorted(snap.gpus, key=lambda g: g.index):
        if not physical[g.index]:
            continue  # a MIG parent: its instances are shown and costed
        held = held_idle(g, online=snap.node.online)
        hourly = costs.hourly(g.model, g.power_w) * physical[g.index] if costs is not None else None
        if held and hourly is not None:
            held_cost += hourly
        job = g.job or next((proc_jobs[pid] for pid in g.pids if pid in proc_jobs), None)
        idle_for = g.idle_for_s
        if now is not None:
            idle_for = max(0.0, (now - g.idle_since).total_seconds()) if g.idle and g.idle_since else None
        gpus.append(FleetGpu(
            index=g.index, uuid=g.uuid, model=g.model, util_pct=g.util_pct, mem_used_mib=g.mem_used_mib,
            mem_total_mib=g.mem_total_mib, mem_pct=g.mem_pct, temp_c=g.temp_c, power_w=g.power_w,
            idle=g.idle, activity_known=g.activity_known, held_idle=held, idle_for_s=idle_for,
            owner=g.owner or (g.owners[0] if g.owners else None),
            processes=len(g.pids), cost_per_hour=hourly, allocated=g.allocated, job=job,
            mig_parent=g.mig_parent, lost=g.lost,
            team=next((proc_teams[pid] for pid in g.pids if pid in proc_teams), node_team),
        ))
    node = FleetNode(name=snap.node.name, cluster=snap.node.cluster, online=snap.node.online,
                     cordoned=snap.node.cordoned, labels=snap.node.labels, gpus=gpus)
    return node, held_cost


def fleet_view(
    snapshots: Iterable[NodeReadings], now: datetime, costs: CostModel | None = None
) -> FleetView:
    """A FleetView from the latest snapshot of each node (the engine's state), in name order."""
    nodes = []
    held_cost = 0.0
    team_label = costs.costs.team_label if costs is not None else "team"
    for snap in sorted(snapshots, key=lambda s: (s.node.cluster, s.node.name)):
        node, cost = fleet_node(snap, costs, team_label)
        nodes.append(node)
        held_cost += cost
    return FleetView(
        time=now,
        currency=costs.currency if costs is not None else "USD",
        team_label=team_label,
        nodes=nodes,
        held_idle_cost_per_hour=held_cost,
        held_idle_cost_per_hour_text=costs.format(held_cost) if costs is not None else "",
    )
