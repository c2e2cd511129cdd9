"""`gpuevents status`'s request: a summary, one node, or a page of the fleet (the replies are views of the engine's
read model, in rules/engine/status.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

TOP = 20
"""Firing incidents and worst nodes a summary carries at most."""


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
