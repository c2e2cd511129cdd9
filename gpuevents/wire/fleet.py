"""The fleet as the engine's replies carry it: a node and its GPUs, an open incident, the schedulers' demand, a
node's held-idle numbers, the fleet's totals and the jobs' exemptions (in `gpuevents status`'s replies, and the
dashboard's `/api/fleet` and `/api/incidents`)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from gpuevents.records import EntityKind, IncidentStatus


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
    activity_known: bool = True  # false: held, nothing measures its activity (neither busy nor idle)
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


class FleetIncident(BaseModel):
    """One incident, as `GET /api/incidents` lists it (the engine lists the firing ones)."""

    id: str
    rule: str
    entity_id: str
    entity_kind: EntityKind
    cluster: str = "default"  # the site of its entity
    status: IncidentStatus = "firing"
    started_at: datetime
    firing_since: datetime | None = None
    severity: str | None = None
    owner: str | None = None
    cost: str | None = None  # estimated waste so far, already formatted ("$12.40")
    cost_value: float | None = None  # the same, as a number in the fleet's currency (to sort by)
    warning: str | None = None
    """Set while none of the warnings it sent was delivered: its staged destructive actions will be refused."""


class WorstNode(BaseModel):
    """A node with GPUs held idle: the summary lists the nodes with the most."""

    name: str
    cluster: str = "default"
    online: bool = True
    gpus: int = 0
    idle: int = 0
    held_idle: int = 0
    held_idle_cost_per_hour: float = 0.0


class FleetSummary(BaseModel):
    """The fleet in a few numbers: what `gpuevents status` prints first."""

    time: datetime
    currency: str = "USD"
    nodes: int = 0
    nodes_online: int = 0
    gpus: int = 0
    busy: int = 0
    idle: int = 0
    unknown: int = 0  # held with no activity signal (a MIG instance without GPM or dcgm-exporter)
    held_idle: int = 0
    held_idle_cost_per_hour: float = 0.0
    held_idle_cost_per_hour_text: str = ""
    incidents_firing: int = 0
    incidents_pending: int = 0


class ExemptionView(BaseModel):
    """A job's exemption from its annotations (gpuevents.io/keep-until, exclude), or one that is malformed."""

    job: str
    until: datetime | None = None
    rules: list[str] | None = None  # None: every rule
    source: str
    malformed: str | None = None  # why it is not applied
