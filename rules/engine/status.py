"""The engine's state for people: `gpuevents status`, and the source the live dashboard reads."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from gpuevents.costs import CostModel
from gpuevents.events import NodeSnapshot
from gpuevents.records import AuditRecord
from rules.core.core import Core
from rules.visibility.fleet_view import FleetIncident, FleetView, fleet_view


class StatusResponse(BaseModel):
    """What the acting engine answers on `gpuevents.engine.status`."""

    fleet: FleetView
    incidents: list[FleetIncident]


def node_snapshots(core: Core, now: datetime) -> list[NodeSnapshot]:
    """The latest known state of every node, with `online`, `last_seen` and `idle_for_s` as of `now`."""
    out = []
    for ns in core.state.nodes.values():
        gpus = []
        for g in sorted(ns.gpu_infos.values(), key=lambda g: g.index):
            idle_for = max(0.0, (now - g.idle_since).total_seconds()) if g.idle and g.idle_since else None
            gpus.append(g.model_copy(update={"idle_for_s": idle_for}))
        info = ns.info.model_copy(update={"online": ns.online, "last_seen": ns.last_seen})
        out.append(NodeSnapshot(node=info, gpus=gpus, processes=list(ns.proc_infos.values())))
    return out


def incident_views(core: Core, now: datetime, costs: CostModel | None = None,
                   statuses: tuple[str, ...] = ("firing",)) -> list[FleetIncident]:
    out = []
    for inc in sorted(core.open_incidents(), key=lambda i: (i.fired_at or i.active_at)):
        if inc.status not in statuses:
            continue
        rule = core.rules.by_name.get(inc.rule)
        ent = core.entity(inc.entity_key)
        owner = getattr(ent.view, "owner", None) if ent is not None else None
        cost = None
        if costs is not None and ent is not None and inc.entity_kind == "gpu" and inc.fired_at:
            hourly = costs.hourly(getattr(ent.view, "model", None), getattr(ent.view, "power_w", None))
            hours = (now - inc.active_at).total_seconds() / 3600
            cost = costs.format(hourly * hours)
        out.append(FleetIncident(
            id=inc.id, rule=inc.rule, entity_id=inc.entity_id, entity_kind=inc.entity_kind,
            status=inc.status, started_at=inc.active_at, firing_since=inc.fired_at,
            severity=(rule.spec.labels.get("severity") if rule is not None else None),
            owner=owner, cost=cost,
        ))
    return out


def fleet_status(core: Core, now: datetime) -> StatusResponse:
    costs = CostModel(core.config.costs)
    return StatusResponse(
        fleet=fleet_view(node_snapshots(core, now), now, costs),
        incidents=incident_views(core, now, costs, statuses=("pending", "firing")),
    )


class EngineDashboardSource:
    """The dashboard's view of a running engine (rules.visibility.fleet_view.DashboardSource)."""

    def __init__(self, engine: object) -> None:
        from rules.engine.service import Engine

        assert isinstance(engine, Engine)
        self.engine = engine
        self.costs = CostModel(engine.config.costs)

    def fleet(self) -> FleetView:
        core = self.engine.core
        now = self.engine.clock.now()
        return fleet_view(node_snapshots(core, now) if core else [], now, self.costs)

    def incidents(self) -> list[FleetIncident]:
        core = self.engine.core
        return incident_views(core, self.engine.clock.now(), self.costs) if core else []

    def recent_audit(self, limit: int) -> list[AuditRecord]:
        return list(reversed(self.engine.audit_tail[-limit:]))
