"""The engine's state for people: `gpuevents status`, and the source the live dashboard reads."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from gpuevents.bus import Bus
from gpuevents.config import CostsConfig
from gpuevents.costs import CostModel
from gpuevents.events import NodeSnapshot
from gpuevents.records import AuditRecord
from gpuevents.subjects import ENGINE_STATUS
from rules.core.core import Core
from rules.core.warnings import undelivered
from rules.dashboard.fleet_view import DemandLine, FleetIncident, FleetView, fleet_view


class ExemptionView(BaseModel):
    """A job's exemption from its annotations (gpuevents.io/keep-until, exclude), or one that is malformed."""

    job: str
    until: datetime | None = None
    rules: list[str] | None = None  # None: every rule
    source: str
    malformed: str | None = None  # why it is not applied


class StatusResponse(BaseModel):
    """What an acting engine answers on `gpuevents.engine.status`: its partition of the fleet (all of it when
    the fleet is not partitioned)."""

    fleet: FleetView
    incidents: list[FleetIncident]
    partition: int | None = None
    partitions: int = 1
    degraded: str | None = None  # why, while JetStream has no room for the engine's writes
    warnings: list[str] = []
    """What the engine cannot set right itself: a node two agents claim."""
    exemptions: list[ExemptionView] = []


def merge_status(replies: list[StatusResponse]) -> StatusResponse:
    """One answer from every partition's: nodes and incidents together, each partition once."""
    seen: dict[int | None, StatusResponse] = {}
    for r in replies:
        seen.setdefault(r.partition, r)
    parts = list(seen.values())
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    held = sum(r.fleet.held_idle_cost_per_hour for r in parts)
    fleet = first.fleet.model_copy(update={
        "nodes": sorted((n for r in parts for n in r.fleet.nodes), key=lambda n: (n.cluster, n.name)),
        "held_idle_cost_per_hour": held,
        "held_idle_cost_per_hour_text": CostModel(CostsConfig(currency=first.fleet.currency)).format(held),
        "demand": [d for r in parts for d in r.fleet.demand],  # one engine reads it; the others have none
    })
    incidents = sorted((i for r in parts for i in r.incidents), key=lambda i: i.firing_since or i.started_at)
    degraded = "; ".join(f"partition {r.partition}: {r.degraded}" for r in parts if r.degraded) or None
    return StatusResponse(fleet=fleet, incidents=incidents, partition=None, partitions=first.partitions,
                          exemptions=[e for r in parts for e in r.exemptions],
                          warnings=[w for r in parts for w in r.warnings], degraded=degraded)


async def ask_status(bus: Bus, timeout: float = 5.0) -> StatusResponse | None:
    """Every acting engine's answer, merged (None when no engine answers)."""
    replies = await bus.request_many(ENGINE_STATUS, b"{}", timeout, enough=status_complete)
    if not replies:
        return None
    return merge_status([StatusResponse.model_validate_json(r) for r in replies])


def status_complete(replies: list[bytes]) -> bool:
    """Whether the status replies gathered so far cover every partition."""
    parts = [StatusResponse.model_validate_json(r) for r in replies]
    return bool(parts) and len({p.partition for p in parts}) >= parts[0].partitions


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
            owner=owner, cost=cost, warning=undelivered(inc),
        ))
    return out


def demand_lines(core: Core, now: datetime) -> list[DemandLine]:
    """What the schedulers report as waiting, from the reports still valid at `now`."""
    out = []
    for (cluster, scheduler), (until, entries) in sorted(core.state.demand.reports.items()):
        if now.timestamp() > until:
            continue
        for e in entries:
            waited = max(0.0, (now - e.waiting_since).total_seconds()) if e.waiting_since is not None else None
            out.append(DemandLine(cluster=cluster, scheduler=scheduler, partition=e.partition, pool=e.pool,
                                  model=e.model, pending_gpus=e.pending_gpus, waiting_for_s=waited))
    return out


def fleet_status(core: Core, now: datetime) -> StatusResponse:
    costs = CostModel(core.config.costs)
    fleet = fleet_view(node_snapshots(core, now), now, costs)
    return StatusResponse(
        fleet=fleet.model_copy(update={"demand": demand_lines(core, now)}),
        incidents=incident_views(core, now, costs, statuses=("pending", "firing")),
        exemptions=exemption_views(core, now),
    )


def exemption_views(core: Core, now: datetime) -> list[ExemptionView]:
    """The jobs' exemptions in force and the malformed ones, by job."""
    ex = core.state.jobs.exemptions
    out = [ExemptionView(job=job, until=e.until, rules=sorted(e.rules) if e.rules else None, source=e.source)
           for job, found in ex.active.items() for e in found if e.until > now]
    out += [ExemptionView(job=job, source=f"{m.annotation}: {m.value}", malformed=m.why)
            for job, bad in ex.malformed.items() for m in bad]
    return sorted(out, key=lambda v: (v.job, v.source))


class EngineDashboardSource:
    """The dashboard's view of this process's engines (rules.dashboard.fleet_view.DashboardSource): one, or
    the partitions a replica acts for."""

    def __init__(self, engines: object) -> None:
        from rules.engine.service import Engine

        self.engines: list[Engine] = list(engines) if isinstance(engines, list | tuple) else [engines]  # type: ignore[list-item]
        assert self.engines and all(isinstance(e, Engine) for e in self.engines)
        self.engine = self.engines[0]
        self.costs = CostModel(self.engine.config.costs)

    def _cores(self) -> list[Core]:
        return [e.core for e in self.engines if e.core is not None and (len(self.engines) == 1 or e.leader.is_set())]

    def fleet(self) -> FleetView:
        now = self.engine.clock.now()
        cores = self._cores()
        view = fleet_view([s for core in cores for s in node_snapshots(core, now)], now, self.costs)
        return view.model_copy(update={"demand": [d for core in cores for d in demand_lines(core, now)]})

    def incidents(self) -> list[FleetIncident]:
        now = self.engine.clock.now()
        found = [i for core in self._cores() for i in incident_views(core, now, self.costs)]
        return sorted(found, key=lambda i: i.firing_since or i.started_at)

    def recent_audit(self, limit: int) -> list[AuditRecord]:
        tails = [r for e in self.engines if e.leader.is_set() or len(self.engines) == 1 for r in e.audit_tail]
        return list(reversed(sorted({r.id: r for r in tails}.values(), key=lambda r: r.time)[-limit:]))
