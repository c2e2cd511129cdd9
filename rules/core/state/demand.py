"""The schedulers' latest demand reports per cluster, and what one entity's `demand` reads from them."""

from __future__ import annotations

from gpuevents.events import DemandEntry, DemandEvent
from rules.lang.views import EvalClock


class DemandBook:
    """Each (cluster, scheduler)'s latest report; a new report replaces the old one whole."""

    def __init__(self, clock: EvalClock) -> None:
        self.clock = clock
        self.reports: dict[tuple[str, str], tuple[float, list[DemandEntry]]] = {}
        """(cluster, scheduler) -> (until when it holds, a timestamp; its entries)"""

    def apply(self, event: DemandEvent) -> None:
        valid = event.data.valid_for_s
        until = event.time.timestamp() + valid if valid is not None else float("inf")
        self.reports[(event.cluster, event.data.scheduler)] = (until, list(event.data.entries))

    def entries(self, cluster: str) -> list[DemandEntry]:
        """The fresh entries of `cluster`, every scheduler's."""
        out: list[DemandEntry] = []
        for (c, _), (until, entries) in sorted(self.reports.items()):
            if c == cluster and self.clock.ts <= until:  # a stale report (its reader stopped) says nothing
                out += entries
        return out

    def lookup(self, cluster: str, partition: str | None, pool: str | None,
               model: str | None) -> tuple[int, float | None, int]:
        """GPUs waiting for the entity's partition, else its pool, else its model; since when; and in the
        whole cluster."""
        entries = self.entries(cluster) if self.reports else []
        if not entries:
            return 0, None, 0
        whole = sum(e.pending_gpus for e in entries if e.partition is None and e.pool is None and e.model is None)
        for field, value in (("partition", partition), ("pool", pool), ("model", model)):
            if value is None:
                continue
            hits = [e for e in entries if getattr(e, field) == value]
            if hits:
                since = [e.waiting_since.timestamp() for e in hits if e.waiting_since is not None and e.pending_gpus]
                return sum(e.pending_gpus for e in hits), min(since, default=None), whole
        return 0, None, whole
