"""Asking the acting engines for `gpuevents status` over the bus (the command line, `gpuevents agent`'s node
names, tests): every engine's reply, one per partition, merged or paged with the models of gpuevents/wire/status.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal, TypeVar

from pydantic import BaseModel

from gpuevents.bus import Bus
from gpuevents.subjects import ENGINE_STATUS
from gpuevents.wire.status import (
    TOP,
    StatusError,
    StatusNode,
    StatusPage,
    StatusQuery,
    StatusSummary,
    decode_reply,
    merge_summaries,
    partition_key,
    replies_complete,
)

_Reply = TypeVar("_Reply", bound=BaseModel)


async def _ask(bus: Bus, q: StatusQuery, model: type[_Reply], timeout: float) -> list[_Reply]:
    """Every acting engine's answer to `q` (one per partition)."""
    replies = await bus.request_many(ENGINE_STATUS, q.model_dump_json().encode(), timeout, enough=replies_complete)
    seen: dict[int | None, _Reply] = {}
    for raw in replies:
        r = decode_reply(raw, model)
        seen.setdefault(getattr(r, "partition", None), r)
    return list(seen.values())


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
