"""`gpuevents status` over the bus: bounded answers from the read model (a summary, one node, or pages of the
fleet each under the server's max payload), asked of every acting engine and merged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Literal, Protocol, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from gpuevents.bus import Bus
from gpuevents.config import CostsConfig
from gpuevents.costs import CostModel
from gpuevents.subjects import ENGINE_STATUS
from gpuevents.wire import TOP, StatusQuery, bad_request
from rules.dashboard.fleet_view import DemandLine, FleetIncident, FleetNode
from rules.engine.readings import ExemptionView
from rules.engine.readmodel import FleetSummary, ReadModel, WorstNode

HEADROOM = 8 * 1024  # bytes of a reply's budget kept for its envelope and the message's headers
ALL = "all"  # the offsets key of an engine that acts for the whole fleet
MAX_EXEMPTIONS = 200  # exemptions a summary lists


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


class ModelSource(Protocol):
    """The engine's read models: the latest (version None), or one kept for paging (None when no longer kept)."""

    async def __call__(self, version: int | None) -> ReadModel | None: ...


class StatusError(Exception):
    """An engine could not answer (a malformed request, or a node too large for a message)."""


def summary_of(model: ReadModel, top: int = TOP, partition: int | None = None, partitions: int = 1,
               degraded: str | None = None) -> StatusSummary:
    """The default answer from a read model: its numbers and the first `top` of its rankings; `degraded` is the
    engine's state now (not the model's)."""
    return StatusSummary(summary=model.summary, incidents=model.top_firing(top),
                         incidents_more=max(0, model.summary.incidents_firing - top),
                         worst_nodes=list(model.worst_nodes[:top]), demand=list(model.demand),
                         warnings=list(model.warnings), degraded=degraded,
                         exemptions=list(model.exemptions[:MAX_EXEMPTIONS]),
                         exemptions_more=max(0, len(model.exemptions) - MAX_EXEMPTIONS),
                         partition=partition, partitions=partitions)


def partition_key(partition: int | None) -> str:
    return ALL if partition is None else str(partition)


async def answer(models: ModelSource, payload: bytes, partition: int | None, partitions: int,
                 max_payload: int, degraded: str | None = None) -> bytes:
    """The reply to one status request, from a read model (never larger than `max_payload`)."""
    try:
        q = StatusQuery.model_validate_json(payload or b"{}")
    except ValidationError as e:
        return bad_request("status", e)
    where = {"partition": partition, "partitions": partitions}
    if q.view in ("nodes", "incidents") and partition_key(partition) in q.done:
        return StatusPage(view=q.view, **where).model_dump_json().encode()
    model = await models(q.versions.get(partition_key(partition)) if q.view in ("nodes", "incidents") else None)
    if model is None:
        return orjson.dumps({"ok": False, "error": "the fleet moved on since the first page (or another engine "
                                                   "took this partition over): ask again from the start"})
    if q.view == "summary":
        reply: BaseModel = summary_of(model, q.top, partition, partitions, degraded)
    elif q.view == "node":
        nodes, incidents = model.node(q.node or "")
        reply = StatusNode(nodes=nodes, incidents=incidents, **where)
    else:
        budget = min(max_payload, q.max_bytes or max_payload) - HEADROOM
        return await _page(model, q, budget, partition, partitions)
    body = reply.model_dump_json().encode()
    if len(body) > max_payload - HEADROOM:  # a node with thousands of GPUs: say so rather than fail to send
        return orjson.dumps({"ok": False, "error": f"the answer ({len(body)} bytes) is larger than the bus takes "
                                                  f"({max_payload}); ask for less (--top)"})
    return body


async def _page(model: ReadModel, q: StatusQuery, budget: int, partition: int | None, partitions: int) -> bytes:
    """As many items from the offset as fit in `budget` bytes (each held as JSON already)."""
    items = model.node_json if q.view == "nodes" else model.incidents
    start = max(0, q.offsets.get(partition_key(partition), 0))
    head = StatusPage(view=q.view, version=model.version, offset=start, total=len(items), partition=partition,
                      partitions=partitions)
    parts: list[bytes] = []
    used = len(head.model_dump_json()) + 64  # the envelope, and room for `next`
    i = start
    while i < len(items):
        raw = items[i]
        if used + len(raw) + 1 > budget:
            if not parts:
                return orjson.dumps({"ok": False, "error": f"{q.view[:-1]} {i} alone ({len(raw)} bytes) is larger "
                                                          f"than a message may be ({budget} bytes)"})
            break
        parts.append(raw)
        used += len(raw) + 1
        i += 1
        if i % 1024 == 0:
            await asyncio.sleep(0)
    head.next = i if i < len(items) else None
    envelope = orjson.loads(head.model_dump_json())
    envelope[q.view] = "\0"
    prefix, _, suffix = orjson.dumps(envelope).partition(b'"\\u0000"')
    return prefix + b"[" + b",".join(parts) + b"]" + suffix


# ------------------------------------------------------------------ asking (the command line, tests)
_Reply = TypeVar("_Reply", bound=BaseModel)


def _decode(raw: bytes, model: type[_Reply]) -> _Reply:
    data = orjson.loads(raw)
    if isinstance(data, dict) and data.get("ok") is False:
        raise StatusError(str(data.get("error")))
    return model.model_validate(data)


def _complete(replies: list[bytes]) -> bool:
    """Whether the replies gathered so far cover every partition."""
    parts = [orjson.loads(r) for r in replies]
    seen = {p.get("partition") for p in parts if isinstance(p, dict)}
    return bool(parts) and len(seen) >= int(parts[0].get("partitions") or 1)


async def _ask(bus: Bus, q: StatusQuery, model: type[_Reply], timeout: float) -> list[_Reply]:
    """Every acting engine's answer to `q` (one per partition)."""
    replies = await bus.request_many(ENGINE_STATUS, q.model_dump_json().encode(), timeout, enough=_complete)
    seen: dict[int | None, _Reply] = {}
    for raw in replies:
        r = _decode(raw, model)
        seen.setdefault(getattr(r, "partition", None), r)
    return list(seen.values())


def merge_summaries(parts: list[StatusSummary], top: int = TOP) -> StatusSummary:
    """One summary from every partition's: numbers added, incidents and worst nodes ranked together."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0].summary
    s = first.model_copy()
    for name in ("nodes", "nodes_online", "gpus", "busy", "idle", "held_idle", "held_idle_cost_per_hour",
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


async def ask_summary(bus: Bus, top: int = TOP, timeout: float = 5.0) -> StatusSummary | None:
    """The fleet summary from every acting engine, merged (None when no engine answers)."""
    parts = await _ask(bus, StatusQuery(top=top), StatusSummary, timeout)
    return merge_summaries(parts, top) if parts else None


async def ask_node(bus: Bus, name: str, timeout: float = 5.0) -> StatusNode | None:
    """One node in full, with its open incidents (None when no engine answers; no nodes when none is named so)."""
    parts = await _ask(bus, StatusQuery(view="node", node=name), StatusNode, timeout)
    if not parts:
        return None
    return StatusNode(nodes=[n for p in parts for n in p.nodes], incidents=[i for p in parts for i in p.incidents],
                      partitions=parts[0].partitions)


async def ask_pages(bus: Bus, view: Literal["nodes", "incidents"] = "nodes",
                    timeout: float = 5.0) -> AsyncIterator[StatusPage]:
    """Every engine's nodes (or open incidents), a page at a time, each page under the bus's max payload; every
    item once: each engine pages through the read model it answered the first page from, so a page never
    repeats or skips an item because the fleet moved meanwhile (StatusError when that model is gone)."""
    offsets: dict[str, int] = {}
    versions: dict[str, int] = {}
    done: set[str] = set()
    while True:
        q = StatusQuery(view=view, offsets=offsets, versions=versions, done=sorted(done), max_bytes=bus.max_payload)
        pages = await _ask(bus, q, StatusPage, timeout)
        if not pages:
            raise StatusError("no engine answered a page of the status")
        for p in pages:
            key = partition_key(p.partition)
            if key in done:
                continue
            yield p
            versions[key] = p.version
            if p.next is None:
                done.add(key)
            else:
                offsets[key] = p.next
        if len(done) >= pages[0].partitions:
            return
