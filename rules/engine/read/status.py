"""The engine's answer to `gpuevents status`: bounded replies from the read model (a summary, one node, or pages of
the fleet each under the server's max payload); the reply models are in gpuevents/wire/status.py, the asking in
gpuevents/cli/ask_status.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import orjson
from pydantic import BaseModel, ValidationError

from gpuevents.wire import TOP, ErrorReply, StatusQuery, bad_request
from gpuevents.wire.status import (
    MAX_EXEMPTIONS,
    SiteView,
    StatusNode,
    StatusPage,
    StatusSummary,
    partition_key,
)
from rules.engine.read.readmodel import ReadModel

HEADROOM = 8 * 1024  # bytes of a reply's budget kept for its envelope and the message's headers


class ModelSource(Protocol):
    """The engine's read models: the latest (version None), or one kept for paging (None when no longer kept)."""

    async def __call__(self, version: int | None) -> ReadModel | None: ...


def _error(text: str) -> bytes:
    return ErrorReply(error=text).model_dump_json().encode()


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


async def answer(models: ModelSource, payload: bytes, partition: int | None, partitions: int,
                 max_payload: int, degraded: str | None = None, sites: Sequence[SiteView] = ()) -> bytes:
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
        return _error("the fleet moved on since the first page (or another engine took this partition over): "
                      "ask again from the start")
    if q.view == "summary":
        summary = summary_of(model, q.top, partition, partitions, degraded)
        summary.sites = [v.model_copy(update={"nodes": sum(c == v.cluster for c, _ in model.node_keys)})
                         for v in sites]
        reply: BaseModel = summary
    elif q.view == "node":
        nodes, incidents = model.node(q.node or "")
        reply = StatusNode(nodes=nodes, incidents=incidents, **where)
    else:
        budget = min(max_payload, q.max_bytes or max_payload) - HEADROOM
        return await _page(model, q, budget, partition, partitions)
    body = reply.model_dump_json().encode()
    if len(body) > max_payload - HEADROOM:  # a node with thousands of GPUs: say so rather than fail to send
        return _error(f"the answer ({len(body)} bytes) is larger than the bus takes ({max_payload}); "
                      "ask for less (--top)")
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
                return _error(f"{q.view[:-1]} {i} alone ({len(raw)} bytes) is larger than a message may be "
                              f"({budget} bytes)")
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
