"""The dashboard's heatmap over time: GPU (or node) × hour for the last hours, from the rollups, with the
held-idle share, the owner and the cost of every cell. Pure."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel

from gpuevents.costs import CostModel
from rules.usage.rollup import HOUR
from rules.usage.store import UsageRow

Per = Literal["auto", "gpu", "node"]
MAX_GPU_ROWS = 256  # `auto` shows one row per GPU up to this many, else one per node


class TimelineRow(BaseModel):
    """One GPU (or node) over the hours; lists are per hour, oldest first."""

    key: str  # `cluster/node/gpu` or `cluster/node`
    label: str
    cluster: str
    node: str
    gpu: int | None  # None: a node row
    gpus: int  # GPUs in the row
    model: str
    team: str  # the team that had it longest ("" none)
    util: list[float | None]  # time-weighted utilization %, None where nothing was counted
    held: list[float]  # share of the counted time held idle, 0–1
    cost: list[float]  # what the hour cost
    held_cost: list[float]  # what its held-idle time cost
    owner: list[int]  # who had it most of the hour: an index into Timeline.owners, -1 nobody
    held_h: float
    held_cost_total: float
    cost_total: float


class Timeline(BaseModel):
    """`GET /api/timeline`: rows most wasteful first."""

    since: datetime
    hours: list[datetime]  # bucket starts, UTC
    per: Literal["gpu", "node"]
    currency: str
    owners: list[str]
    rows: list[TimelineRow]
    total_rows: int
    left_out: int
    simulated: bool = False  # the store holds simulated usage (`gpuevents simulate --history`)


def hour_window(now: datetime, hours: int) -> tuple[int, int]:
    """The bucket starts of the last `hours` hours, the current one included: [first, end)."""
    end = int(now.timestamp()) // HOUR * HOUR + HOUR
    return end - hours * HOUR, end


def _natural(label: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", label))


class _Acc:
    __slots__ = ("busy", "cost", "free", "gpus", "held", "held_cost", "known", "model", "owner_s", "team_s",
                 "util_s")

    def __init__(self, n: int) -> None:
        self.util_s = [0.0] * n
        self.known = [0.0] * n
        self.held = [0.0] * n
        self.busy = [0.0] * n
        self.free = [0.0] * n
        self.cost = [0.0] * n
        self.held_cost = [0.0] * n
        self.owner_s: list[dict[str, float]] = [{} for _ in range(n)]
        self.team_s: dict[str, float] = defaultdict(float)
        self.gpus: set[int] = set()
        self.model = ""


def _matches(query: str, row: TimelineRow, owners: list[str]) -> bool:
    hay = [row.label, row.cluster, row.model, row.team] + [owners[i] for i in set(row.owner) if i >= 0]
    return any(query in h.lower() for h in hay)


def timeline(rows: Iterable[UsageRow], costs: CostModel, *, first: int, hours: int, per: Per = "auto",
             query: str = "", limit: int = 200) -> Timeline:
    """Add the buckets of [first, first + hours h) up per GPU (or node) and hour; rows matching `query` (a part of
    the node, cluster, model, team or an owner), most held-idle cost first, at most `limit`."""
    rows = list(rows)
    if per == "auto":
        per = "gpu" if len({(r.cluster, r.node, r.gpu) for r in rows}) <= MAX_GPU_ROWS else "node"
    multi = len({r.cluster for r in rows}) > 1
    acc: dict[tuple[str, str, int | None], _Acc] = {}
    for r in rows:
        i = (r.hour - first) // HOUR
        if not 0 <= i < hours:
            continue
        key = (r.cluster, r.node, r.gpu if per == "gpu" else None)
        a = acc.get(key)
        if a is None:
            a = acc[key] = _Acc(hours)
        capital_h = costs.capital_daily(r.model or None) / 24
        held_cost = capital_h * r.held_s / HOUR + costs.energy_cost(r.held_kwh)
        a.util_s[i] += r.util_s
        a.known[i] += r.util_known_s
        a.held[i] += r.held_s
        a.busy[i] += r.busy_s
        a.free[i] += r.free_s
        a.held_cost[i] += held_cost
        a.cost[i] += held_cost + capital_h * (r.busy_s + r.free_s) / HOUR + costs.energy_cost(r.busy_kwh + r.free_kwh)
        if r.owner:
            a.owner_s[i][r.owner] = a.owner_s[i].get(r.owner, 0.0) + r.busy_s + r.held_s
        a.team_s[r.team] += r.busy_s + r.held_s + r.free_s
        a.gpus.add(r.gpu)
        a.model = a.model or r.model
    owner_ids: dict[str, int] = {}
    out = []
    for (cluster, node, gpu), a in acc.items():
        prefix = f"{cluster}:" if multi else ""
        label = f"{prefix}{node}/gpu{gpu}" if gpu is not None else f"{prefix}{node}"
        owner = []
        for held_by in a.owner_s:
            if held_by:
                name = max(held_by, key=lambda o: (held_by[o], o))
                owner.append(owner_ids.setdefault(name, len(owner_ids)))
            else:
                owner.append(-1)
        totals = [b + h + f for b, h, f in zip(a.busy, a.held, a.free, strict=True)]
        out.append(TimelineRow(
            key=f"{cluster}/{node}" + (f"/{gpu}" if gpu is not None else ""), label=label, cluster=cluster,
            node=node, gpu=gpu, gpus=len(a.gpus), model=a.model,
            team=max(a.team_s, key=lambda t: (a.team_s[t], t)) if a.team_s else "",
            util=[round(u / k, 1) if k > 0 else None for u, k in zip(a.util_s, a.known, strict=True)],
            held=[round(h / t, 3) if t > 0 else 0.0 for h, t in zip(a.held, totals, strict=True)],
            cost=[round(c, 2) for c in a.cost], held_cost=[round(c, 2) for c in a.held_cost], owner=owner,
            held_h=sum(a.held) / HOUR, held_cost_total=sum(a.held_cost), cost_total=sum(a.cost),
        ))
    owners = sorted(owner_ids, key=owner_ids.__getitem__)
    if query:
        q = query.lower()
        out = [r for r in out if _matches(q, r, owners)]
    out.sort(key=lambda r: (-r.held_cost_total, _natural(r.label)))
    kept = out[:limit]
    used = sorted({i for r in kept for i in r.owner if i >= 0})
    remap = {old: new for new, old in enumerate(used)}
    for row in kept:
        row.owner = [remap.get(i, -1) for i in row.owner]
    return Timeline(
        since=datetime.fromtimestamp(first, UTC), hours=[datetime.fromtimestamp(first + i * HOUR, UTC)
                                                         for i in range(hours)],
        per=per, currency=costs.currency, owners=[owners[i] for i in used], rows=kept, total_rows=len(out),
        left_out=max(0, len(out) - limit),
    )
