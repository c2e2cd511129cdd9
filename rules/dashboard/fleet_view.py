"""What the dashboard shows, as JSON API models, and the Protocol the engine implements to feed it."""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from datetime import datetime
from typing import Protocol

from pydantic import BaseModel, computed_field

from gpuevents.costs import CostModel, physical_shares
from gpuevents.events import NodeSnapshot
from gpuevents.records import AuditRecord, EntityKind, IncidentStatus


class FleetGpu(BaseModel):
    index: int
    uuid: str = ""
    model: str | None = None
    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    mem_pct: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    idle: bool = False
    held_idle: bool = False  # idle, with a process on it (or allocated to a job by a scheduler)
    idle_for_s: float | None = None
    owner: str | None = None
    processes: int = 0
    cost_per_hour: float | None = None
    allocated: bool | None = None  # a scheduler allocated it (DESIGN §2); null: no scheduler integration
    job: str | None = None  # the scheduler job it is allocated to, else the job of a process on it
    mig_parent: str | None = None
    lost: bool = False
    team: str | None = None  # the team label of a process on it (its pod's), else of its node


class FleetNode(BaseModel):
    name: str
    cluster: str = "default"
    online: bool = True
    cordoned: bool | None = None
    labels: dict[str, str] = {}
    gpus: list[FleetGpu] = []


class DemandLine(BaseModel):
    """GPUs waiting to be allocated, as a scheduler reports them (one partition, pool or model; or, with none
    of them, the whole cluster)."""

    cluster: str
    scheduler: str
    partition: str | None = None
    pool: str | None = None
    model: str | None = None
    pending_gpus: int
    waiting_for_s: float | None = None


class FleetView(BaseModel):
    """`GET /api/fleet`: every node and GPU now, with the counts and the money held idle per hour."""

    time: datetime
    currency: str = "USD"
    team_label: str = "team"  # the node (or pod) label that names a team (config costs.team_label)
    nodes: list[FleetNode] = []
    held_idle_cost_per_hour: float = 0.0
    held_idle_cost_per_hour_text: str = ""
    demand: list[DemandLine] = []

    @computed_field  # type: ignore[prop-decorator]
    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def busy(self) -> int:
        return sum(1 for n in self.nodes for g in n.gpus if not g.idle)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def idle(self) -> int:
        return sum(1 for n in self.nodes for g in n.gpus if g.idle)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def held_idle(self) -> int:
        return sum(1 for n in self.nodes for g in n.gpus if g.held_idle)


class FleetIncident(BaseModel):
    """One incident, as `GET /api/incidents` lists it (the engine lists the firing ones)."""

    id: str
    rule: str
    entity_id: str
    entity_kind: EntityKind
    status: IncidentStatus = "firing"
    started_at: datetime
    firing_since: datetime | None = None
    severity: str | None = None
    owner: str | None = None
    cost: str | None = None  # estimated waste so far, already formatted ("$12.40")
    warning: str | None = None
    """Set while none of the warnings it sent was delivered: its staged destructive actions will be refused."""


class IncidentsResponse(BaseModel):
    incidents: list[FleetIncident]


class AuditResponse(BaseModel):
    records: list[AuditRecord]


class DashboardSource(Protocol):
    """What the engine gives the dashboard. Called on every API request: answer from memory, fast.

    Each method may return its value or an awaitable of it.
    """

    def fleet(self) -> FleetView | Awaitable[FleetView]: ...

    def incidents(self) -> list[FleetIncident] | Awaitable[list[FleetIncident]]: ...

    def recent_audit(self, limit: int) -> list[AuditRecord] | Awaitable[list[AuditRecord]]:
        """The newest `limit` audit records, newest first."""
        ...


def fleet_view(
    snapshots: Iterable[NodeSnapshot], now: datetime, costs: CostModel | None = None
) -> FleetView:
    """A FleetView from the latest snapshot of each node (the engine's state), in name order."""
    nodes = []
    held_cost = 0.0
    team_label = costs.costs.team_label if costs is not None else "team"
    for snap in sorted(snapshots, key=lambda s: (s.node.cluster, s.node.name)):
        gpus = []
        physical = physical_shares(snap.gpus)
        proc_jobs = {p.pid: p.job for p in snap.processes if p.job}
        proc_teams = {p.pid: p.labels[team_label] for p in snap.processes if p.labels.get(team_label)}
        node_team = snap.node.labels.get(team_label) or None
        for g in sorted(snap.gpus, key=lambda g: g.index):
            if not physical[g.index]:
                continue  # a MIG parent: its instances are shown and costed
            held = g.idle and bool(g.pids or g.owners or g.allocated)
            hourly = costs.hourly(g.model, g.power_w) * physical[g.index] if costs is not None else None
            if held and hourly is not None:
                held_cost += hourly
            job = g.job or next((proc_jobs[pid] for pid in g.pids if pid in proc_jobs), None)
            gpus.append(FleetGpu(
                index=g.index, uuid=g.uuid, model=g.model, util_pct=g.util_pct, mem_used_mib=g.mem_used_mib,
                mem_total_mib=g.mem_total_mib, mem_pct=g.mem_pct, temp_c=g.temp_c, power_w=g.power_w,
                idle=g.idle, held_idle=held, idle_for_s=g.idle_for_s,
                owner=g.owner or (g.owners[0] if g.owners else None),
                processes=len(g.pids), cost_per_hour=hourly, allocated=g.allocated, job=job,
                mig_parent=g.mig_parent, lost=g.lost,
                team=next((proc_teams[pid] for pid in g.pids if pid in proc_teams), node_team),
            ))
        nodes.append(FleetNode(name=snap.node.name, cluster=snap.node.cluster, online=snap.node.online,
                              cordoned=snap.node.cordoned, labels=snap.node.labels, gpus=gpus))
    return FleetView(
        time=now,
        currency=costs.currency if costs is not None else "USD",
        team_label=team_label,
        nodes=nodes,
        held_idle_cost_per_hour=held_cost,
        held_idle_cost_per_hour_text=costs.format(held_cost) if costs is not None else "",
    )
