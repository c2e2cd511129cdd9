"""The rollups as the dashboard reads them: the last hours from `engine.usage_db`, in a worker thread, cached a
little so that many screens (and every filter typed) do not each read the file."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from gpuevents.costs import CostModel
from rules.dashboard.timeline import Per, Timeline, hour_window, timeline
from rules.usage.store import UsageRow, UsageStore

CACHE_S = 20.0  # the engine writes on its tick (30 s by default): fresher reads would show nothing new


class UsageSource:
    """`timeline(...)` for `GET /api/timeline`; an absent file is an empty timeline, not an error."""

    def __init__(self, path: Path, costs: CostModel, now: Callable[[], datetime] | None = None,
                 cache_s: float = CACHE_S) -> None:
        self.path = path
        self.costs = costs
        self.now = now or (lambda: datetime.now(UTC))
        self.cache_s = cache_s
        self._cached: tuple[float, tuple[int, int], list[UsageRow]] | None = None
        self._lock = asyncio.Lock()

    def _read(self, first: int, end: int) -> list[UsageRow]:
        if not self.path.exists():
            return []
        with UsageStore(self.path) as store:
            return store.usage(first, end)

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
        return await asyncio.to_thread(timeline, rows, self.costs, first=first, hours=hours, per=per,
                                       query=query, limit=limit)
