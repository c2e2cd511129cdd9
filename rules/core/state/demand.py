"""The schedulers' latest demand reports per cluster, and what one entity's `demand` reads from them."""

from __future__ import annotations

from dataclasses import dataclass

from gpuevents.events import DemandEntry, DemandEvent
from rules.lang.views import EvalClock

_KINDS = ("partition", "pool", "model")


@dataclass(frozen=True, slots=True)
class _Report:
    """One scheduler's report, indexed for lookups: (kind, name) -> (GPUs waiting, since when, a timestamp)."""

    until: float
    entries: tuple[DemandEntry, ...]
    index: dict[tuple[str, str], tuple[int, float | None]]
    whole: int


def _indexed(entries: list[DemandEntry], until: float) -> _Report:
    index: dict[tuple[str, str], tuple[int, float | None]] = {}
    whole = 0
    for e in entries:
        since = e.waiting_since.timestamp() if e.waiting_since is not None and e.pending_gpus else None
        keys = [(k, getattr(e, k)) for k in _KINDS if getattr(e, k) is not None]
        if not keys:
            whole += e.pending_gpus
        for key in keys:
            n, old = index.get(key, (0, None))
            index[key] = (n + e.pending_gpus, min((t for t in (old, since) if t is not None), default=None))
    return _Report(until, tuple(entries), index, whole)


class DemandBook:
    """Each (cluster, scheduler)'s latest report; a new report replaces the old one whole."""

    def __init__(self, clock: EvalClock) -> None:
        self.clock = clock
        self.by_cluster: dict[str, dict[str, _Report]] = {}
        self.version = 0

    def apply(self, event: DemandEvent) -> None:
        valid = event.data.valid_for_s
        until = event.time.timestamp() + valid if valid is not None else float("inf")
        self.by_cluster.setdefault(event.cluster, {})[event.data.scheduler] = _indexed(event.data.entries, until)
        self.version += 1

    @property
    def reports(self) -> dict[tuple[str, str], tuple[float, tuple[DemandEntry, ...]]]:
        """(cluster, scheduler) -> (until when it holds, a timestamp; its entries)."""
        return {(c, s): (r.until, r.entries) for c, by in sorted(self.by_cluster.items())
                for s, r in sorted(by.items())}

    def lookup(self, cluster: str, partition: str | None, pool: str | None,
               model: str | None) -> tuple[int, float | None, int]:
        """GPUs waiting for the entity's partition, else its pool, else its model; since when; and in the
        whole cluster. A stale report (its reader stopped) says nothing."""
        reports = self.by_cluster.get(cluster)
        if not reports:
            return 0, None, 0
        now = self.clock.ts
        if len(reports) == 1:  # the usual case: one scheduler per cluster
            (r,) = reports.values()
            if now > r.until:
                return 0, None, 0
            index = r.index
            for kind, value in (("partition", partition), ("pool", pool), ("model", model)):
                if value is not None and (x := index.get((kind, value))) is not None:
                    return x[0], x[1], r.whole
            return 0, None, r.whole
        live = [r for r in reports.values() if now <= r.until]
        whole = sum(r.whole for r in live)
        for kind, value in (("partition", partition), ("pool", pool), ("model", model)):
            if value is None:
                continue
            hits = [x for r in live if (x := r.index.get((kind, value))) is not None]
            if hits:
                return sum(n for n, _ in hits), min((t for _, t in hits if t is not None), default=None), whole
        return 0, None, whole
