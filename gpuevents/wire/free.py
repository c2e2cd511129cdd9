"""`gpuevents free`'s request (and `GET /api/free`'s, from its query string), what the job needs, and its answer
(built from the read model in rules/dashboard/free.py), with how the answers of several engines merge into one."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime

from pydantic import BaseModel, Field

MIB_PER = {"": 1.0, "m": 1.0, "mb": 1.0, "mib": 1.0, "g": 1024.0, "gb": 1024.0, "gib": 1024.0,
           "t": 1024.0**2, "tb": 1024.0**2, "tib": 1024.0**2}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
MAX_COUNT = 1024


class FreeQueryError(ValueError):
    """A query that cannot be answered; the message says which part and what to write instead."""


def parse_mem_mib(text: str, what: str = "--min-free-mem") -> float:
    """`40G`, `40GiB`, `40000M`, `1.5T` or a plain number of MiB, as MiB. G, GB and GiB all mean 1024 MiB, as
    nvidia-smi counts."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in MIB_PER:
        raise FreeQueryError(f"{what} must be a size like 40G, 40GiB or 40000M, got {text!r}")
    return float(m.group(1)) * MIB_PER[unit]


def parse_labels(items: Iterable[str], what: str = "--label") -> dict[str, str | None]:
    """`team=vision` (the label has that value) or `team` (the node has the label at all)."""
    out: dict[str, str | None] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not key:
            raise FreeQueryError(f"{what} must be KEY=VALUE or KEY, got {item!r}")
        out[key] = value.strip() if eq else None
    return out


class FreeQuery(BaseModel):
    """What the job needs. `count`: that many GPUs on one node (nodes with fewer are not offered)."""

    count: int | None = Field(None, ge=1, le=MAX_COUNT)
    min_free_mem_mib: float | None = Field(None, ge=0)
    model: str | None = None  # a case-insensitive part of the model name: "H100"
    labels: dict[str, str | None] = Field(default_factory=dict)  # node labels; None: any value
    cluster: str | None = None
    limit: int | None = Field(None, ge=1, description="at most this many nodes in the answer")

    @classmethod
    def from_params(cls, params: Mapping[str, str], labels: Iterable[str] = ()) -> FreeQuery:
        """From the query string of `GET /api/free` (`count`, `min_free_mem`, `model`, `label`, `cluster`,
        `limit`); FreeQueryError says which parameter is wrong."""
        def number(name: str, low: int, high: int | None = None) -> int | None:
            raw = params.get(name)
            if raw is None or raw == "":
                return None
            if not raw.strip().isdigit() or int(raw) < low or (high is not None and int(raw) > high):
                bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
                raise FreeQueryError(f"{name} must be a whole number {bound}, got {raw!r}")
            return int(raw)

        mem = params.get("min_free_mem")
        return cls(
            count=number("count", 1, MAX_COUNT),
            min_free_mem_mib=parse_mem_mib(mem, "min_free_mem") if mem else None,
            model=params.get("model") or None,
            labels=parse_labels(labels, "label"),
            cluster=params.get("cluster") or None,
            limit=number("limit", 1),
        )


# why a GPU was not offered, in the order they are checked
REASONS = ("offline", "cordoned", "lost", "allocated", "held", "busy", "filtered")


class FreeGpu(BaseModel):
    cluster: str
    node: str
    index: int
    uuid: str = ""
    device: str  # what CUDA_VISIBLE_DEVICES takes: the index, or the UUID of a MIG instance
    model: str | None = None
    util_pct: float | None = None
    idle_for_s: float | None = None
    mem_free_mib: float | None = None
    mem_total_mib: float | None = None


class FreeNode(BaseModel):
    cluster: str
    node: str
    labels: dict[str, str] = {}
    gpus: list[FreeGpu]
    cuda_visible_devices: str
    env: str  # the line to start a job with: `CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2,3`


class FreeAnswer(BaseModel):
    """`GET /api/free` and `gpuevents free --json`: nodes best first, each with its GPUs most idle first."""

    time: datetime
    query: FreeQuery
    nodes: list[FreeNode]
    free_gpus: int  # GPUs that could be offered (before `count` and `limit`)
    excluded: dict[str, int]  # GPUs not offered, by reason (see REASONS)
    more_nodes: int = 0  # nodes that matched but were left out to keep the answer under the bus's max payload


def idleness(gpu: FreeGpu) -> tuple[float, float, float, int]:
    """Sort key, most idle first: idle longest, then least utilized, then most memory free."""
    return (-(gpu.idle_for_s or 0.0), gpu.util_pct or 0.0, -(gpu.mem_free_mib or 0.0), gpu.index)


def ranked(time: datetime, query: FreeQuery, nodes: list[FreeNode], total: int,
            excluded: Mapping[str, int]) -> FreeAnswer:
    """Nodes best first: with `count`, the node whose least idle chosen GPU is the most idle; else the node with
    the most idle GPU; cut to `limit`."""
    pick = -1 if query.count is not None else 0
    nodes = sorted(nodes, key=lambda n: (idleness(n.gpus[pick])[:3], n.cluster, n.node))
    if query.limit is not None:
        nodes = nodes[:query.limit]
    return FreeAnswer(time=time, query=query, nodes=nodes, free_gpus=total,
                      excluded={k: v for k, v in excluded.items() if v})


def merge_answers(answers: list[FreeAnswer], query: FreeQuery) -> FreeAnswer:
    """One answer from the answers of the engines that each act for a part of the fleet (engine.partitions)."""
    excluded: dict[str, int] = {}
    for a in answers:
        for k, v in a.excluded.items():
            excluded[k] = excluded.get(k, 0) + v
    nodes = [n for a in answers for n in a.nodes]
    merged = ranked(max(a.time for a in answers), query, nodes, sum(a.free_gpus for a in answers), excluded)
    merged.more_nodes = sum(a.more_nodes for a in answers)
    return merged
