"""The rollups as the dashboard reads them: the last hours from `engine.usage_db` (and each team's weeks against
its target), in a worker thread, cached a little so that many screens (and every filter typed) do not each read
the file."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpuevents.costs import CostModel
from rules.dashboard.timeline import Per, Timeline, hour_window, timeline
from rules.usage.quarter import QuarterReport, build_quarter
from rules.usage.rollup import HOUR
from rules.usage.store import UsageRow, UsageStore

CACHE_S = 20.0  # the engine writes on its tick (30 s by default): fresher reads would show nothing new
QUARTER_CACHE_S = 600.0  # a week's point moves little in ten minutes; many weeks of rows are a bigger read


class UsageSource:
    """`timeline(...)` for `GET /api/timeline`; an absent file is an empty timeline, not an error."""

    def __init__(self, path: Path, costs: CostModel, now: Callable[[], datetime] | None = None,
                 cache_s: float = CACHE_S, targets: Mapping[str, float | None] | None = None) -> None:
        self.path = path
        self.costs = costs
        self.now = now or (lambda: datetime.now(UTC))
        self.cache_s = cache_s
        self.targets = dict(targets or {})  # team -> target utilization (config `teams.<t>.target_util_pct`)
        self._cached: tuple[float, tuple[int, int], list[UsageRow]] | None = None
        self._quarter: tuple[float, tuple[int, int], QuarterReport] | None = None
        self._lock = asyncio.Lock()
        self.simulated = False  # simulated usage was written to the store (as last read)

    def _read(self, first: int, end: int) -> list[UsageRow]:
        if not self.path.exists():
            return []
        with UsageStore(self.path) as store:
            self.simulated = store.simulated(first, end)
            return store.usage(first, end)

    def _read_quarter(self, first: int, end: int) -> QuarterReport:
        since, until = datetime.fromtimestamp(first, UTC), datetime.fromtimestamp(end, UTC)
        if not self.path.exists():
            return build_quarter([], self.costs, since, until, self.targets)
        with UsageStore(self.path) as store:
            rows = store.week_sums(first, end)  # summed in SQLite: a few rows, not every hour of the fleet
            simulated = store.simulated(first, end)
        return build_quarter(rows, self.costs, since, until, self.targets, simulated=simulated)

    async def quarter(self, weeks: int) -> QuarterReport:
        """Each team's (and the fleet's) utilization week by week over the last `weeks` weeks, the current hour
        included, against its target; marked when the store holds simulated usage."""
        end = int(self.now().timestamp()) // HOUR * HOUR + HOUR
        window = (end - int(timedelta(weeks=weeks).total_seconds()), end)
        async with self._lock:
            c = self._quarter
            if c is not None and c[1] == window and time.monotonic() - c[0] < QUARTER_CACHE_S:
                return c[2]
            q = await asyncio.to_thread(self._read_quarter, *window)
            self._quarter = (time.monotonic(), window, q)
            return q

    async def rows(self, first: int, end: int) -> list[UsageRow]:
        async with self._lock:  # one read at a time; the others wait for it and share it
            c = self._cached
            if c is not None and c[1] == (first, end) and time.monotonic() - c[0] < self.cache_s:
                return c[2]
            rows = await asyncio.to_thread(self._read, first, end)
            self._cached = (time.monotonic(), (first, end), rows)
            return rows

    async def timeline(self, hours: int, per: Per = "auto", query: str = "", limit: int = 200) -> Timeline:
        first, end = hour_window(self.now(), hours)
        rows = await self.rows(first, end)
        t = await asyncio.to_thread(timeline, rows, self.costs, first=first, hours=hours, per=per,
                                    query=query, limit=limit)
        return t.model_copy(update={"simulated": self.simulated})
