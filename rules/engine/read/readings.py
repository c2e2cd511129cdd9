"""The read side's one narrow accessor into the core's state: node keys, a node's readings, the open incidents."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from msgspec.structs import replace

from gpuevents.agentdata import GpuInfo, NodeInfo, ProcessInfo
from gpuevents.holding import count_held_idle
from gpuevents.wire.fleet import DemandLine, ExemptionView
from rules.core.core import Core
from rules.core.incidents import Incident
from rules.core.warning_ledger import undelivered


@dataclass(frozen=True, slots=True)
class NodeReading:
    """A node's latest readings: its info (with `online` and `last_seen`), GPUs and processes, each immutable."""

    node: NodeInfo
    gpus: list[GpuInfo]
    processes: list[ProcessInfo]


@dataclass(frozen=True, slots=True)
class IncidentContext:
    """What the read side shows of an incident's entity: its rule's severity, its owner, the GPU's model and
    power (to cost it)."""

    severity: str | None = None
    owner: str | None = None
    model: str | None = None
    power_w: float | None = None
    warning: str | None = None  # set while none of the warnings it sent was delivered


def node_keys(core: Core) -> list[str]:
    """Every node the core knows, as keys for `node_reading` (a copy: the core may change meanwhile)."""
    return list(core.state.nodes)


def node_reading(core: Core, key: str) -> NodeReading | None:
    """The latest readings of one node, with `online` and `last_seen` (None: forgotten since the keys were read),
    sharing the core's immutable GPU and process readings."""
    ns = core.state.nodes.get(key)
    if ns is None:
        return None
    info = replace(ns.info, online=ns.online, last_seen=ns.last_seen)
    return NodeReading(node=info, gpus=list(ns.gpu_infos.values()), processes=list(ns.proc_infos.values()))


def held_idle_count(core: Core) -> int:
    """How many GPUs are held idle now, as status and the dashboard count them (gpuevents/holding.py)."""
    return sum(count_held_idle(ns.gpu_infos.values(), online=ns.online) for ns in core.state.nodes.values())


def open_incidents(core: Core) -> Iterator[list[Incident]]:
    """The open (pending and firing) incidents, a rule's at a time: each list is taken whole (a copy of
    references, no work per incident), so a reader can pause between them while the core moves on. Each
    incident is immutable."""
    for incs in list(core.incidents.values()):
        yield list(incs.values())


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


def exemption_views(core: Core, now: datetime) -> list[ExemptionView]:
    """The jobs' exemptions in force and the malformed ones, by job."""
    ex = core.state.jobs.exemptions
    out = [ExemptionView(job=job, until=e.until, rules=sorted(e.rules) if e.rules else None, source=e.source)
           for job, found in ex.active.items() for e in found if e.until > now]
    out += [ExemptionView(job=job, source=f"{m.annotation}: {m.value}", malformed=m.why)
            for job, bad in ex.malformed.items() for m in bad]
    return sorted(out, key=lambda v: (v.job, v.source))


def incident_context(core: Core, inc: Incident) -> IncidentContext:
    rule = core.rules.by_name.get(inc.rule)
    ent = core.entity(inc.entity_key)
    view = ent.view if ent is not None else None
    return IncidentContext(severity=rule.spec.labels.get("severity") if rule is not None else None,
                           owner=getattr(view, "owner", None), model=getattr(view, "model", None),
                           power_w=getattr(view, "power_w", None), warning=undelivered(inc))
