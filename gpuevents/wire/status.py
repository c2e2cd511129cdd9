"""`gpuevents status`'s request (a summary, one node, or a page of the fleet) and its replies, views of the
engine's read model (built in rules/engine/read/status.py), with how the replies of several engines merge into one."""

from __future__ import annotations

from datetime import datetime
from typing import Literal, TypeVar

import orjson
from pydantic import BaseModel, Field

from gpuevents.config import CostsConfig
from gpuevents.costs import CostModel
from gpuevents.wire.fleet import DemandLine, ExemptionView, FleetIncident, FleetNode, FleetSummary, WorstNode

TOP = 20
"""Firing incidents and worst nodes a summary carries at most."""
MAX_EXEMPTIONS = 200  # exemptions a summary lists
ALL = "all"  # the offsets key of an engine that acts for the whole fleet


class StatusQuery(BaseModel):
    """A status request. `summary` (the default, also for an empty `{}`): the fleet's numbers, the firing
    incidents most costly first and the worst nodes, `top` of each. `node`: one node in full, with its open
    incidents. `nodes` / `incidents`: a page of them from each engine's offset, under `max_bytes`."""

    view: Literal["summary", "node", "nodes", "incidents"] = "summary"
    node: str | None = None
    offsets: dict[str, int] = Field(default_factory=dict)  # partition (or "all") -> where its page starts
    versions: dict[str, int] = Field(default_factory=dict)  # partition -> the read model its first page came from
    done: list[str] = Field(default_factory=list)  # partitions whose pages have all been read: an empty answer
    max_bytes: int | None = Field(None, ge=16 * 1024)  # the asker's max payload; the engine's own bounds it too
    top: int = Field(TOP, ge=1, le=TOP)


class SiteView(BaseModel):
    """A site on a leaf server, as the hub hears from its store (DESIGN §9)."""

    cluster: str
    domain: str
    linked: bool  # False: cut off (or catching up): its nodes' readings are as of `last_heard`, no remedy decided
    last_heard: datetime | None = None
    behind: int = 0  # events its store holds that the hub has not yet
    nodes: int = 0
    error: str | None = None


class StatusSummary(BaseModel):
    """The default answer: small whatever the fleet's size."""

    summary: FleetSummary
    incidents: list[FleetIncident]  # firing, most costly first, then the longest firing
    incidents_more: int = 0  # firing incidents not listed
    worst_nodes: list[WorstNode]  # most GPUs held idle first
    demand: list[DemandLine] = []  # what the schedulers report as waiting (one engine reads it)
    degraded: str | None = None  # why, while JetStream has no room for the engine's writes
    warnings: list[str] = []
    """What the engine cannot set right itself: a node two agents claim."""
    exemptions: list[ExemptionView] = []  # jobs exempt by their annotations, and annotations not applied
    exemptions_more: int = 0  # exemptions not listed (at most MAX_EXEMPTIONS are)
    partition: int | None = None
    partitions: int = 1
    sites: list[SiteView] = []  # the sites on leaf servers (nats.sites), linked or cut off


class StatusNode(BaseModel):
    nodes: list[FleetNode]  # one per cluster that has a node of that name (usually one, or none)
    incidents: list[FleetIncident]
    partition: int | None = None
    partitions: int = 1


class StatusPage(BaseModel):
    """A page of one engine's nodes or open incidents; `next` is where its next page starts (None: done)."""

    view: Literal["nodes", "incidents"]
    nodes: list[FleetNode] = []
    incidents: list[FleetIncident] = []
    version: int = 0  # the read model the pages come from: ask the next page of the same one
    offset: int = 0
    next: int | None = None
    total: int = 0
    partition: int | None = None
    partitions: int = 1


class StatusError(Exception):
    """An engine could not answer (a malformed request, or a node too large for a message)."""


def partition_key(partition: int | None) -> str:
    return ALL if partition is None else str(partition)


_Reply = TypeVar("_Reply", bound=BaseModel)


def decode_reply(raw: bytes, model: type[_Reply]) -> _Reply:
    """One engine's reply as `model`; StatusError with its error when it could not answer."""
    data = orjson.loads(raw)
    if isinstance(data, dict) and data.get("ok") is False:
        raise StatusError(str(data.get("error")))
    return model.model_validate(data)


def replies_complete(replies: list[bytes]) -> bool:
    """Whether the replies gathered so far cover every partition."""
    parts = [orjson.loads(r) for r in replies]
    seen = {p.get("partition") for p in parts if isinstance(p, dict)}
    return bool(parts) and len(seen) >= int(parts[0].get("partitions") or 1)


def merge_summaries(parts: list[StatusSummary], top: int = TOP) -> StatusSummary:
    """One summary from every partition's: numbers added, incidents and worst nodes ranked together."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0].summary
    s = first.model_copy()
    for name in ("nodes", "nodes_online", "gpus", "busy", "idle", "unknown", "held_idle", "held_idle_cost_per_hour",
                 "incidents_firing", "incidents_pending"):
        setattr(s, name, sum(getattr(p.summary, name) for p in parts))
    s.time = max(p.summary.time for p in parts)
    s.held_idle_cost_per_hour_text = CostModel(CostsConfig(currency=first.currency)).format(
        s.held_idle_cost_per_hour)
    incidents = sorted((i for p in parts for i in p.incidents),
                       key=lambda i: (-(i.cost_value or 0.0), i.firing_since or i.started_at))
    worst = sorted((w for p in parts for w in p.worst_nodes),
                   key=lambda w: (-w.held_idle, -w.held_idle_cost_per_hour, -w.idle, w.cluster, w.name))
    return StatusSummary(summary=s, incidents=incidents[:top],
                         incidents_more=sum(p.incidents_more for p in parts) + max(0, len(incidents) - top),
                         worst_nodes=worst[:top], demand=[d for p in parts for d in p.demand],
                         warnings=[w for p in parts for w in p.warnings],
                         degraded="; ".join(f"partition {p.partition}: {p.degraded}" for p in parts if p.degraded)
                         or None,
                         exemptions=[e for p in parts for e in p.exemptions][:MAX_EXEMPTIONS],
                         exemptions_more=sum(p.exemptions_more for p in parts) + max(
                             0, sum(len(p.exemptions) for p in parts) - MAX_EXEMPTIONS), partition=None,
                         partitions=parts[0].partitions)
