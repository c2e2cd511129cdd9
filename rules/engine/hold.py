"""The acting core behind its lock: who steps it waits for the commit in flight, and each change is counted.

The consume loop, the tick, a reload, a take-over and the answers to people (rules/engine/answers.py) all step
the same core; they take `held()`, which holds the lock and lets the previous batch's commit finish first, so
commits stay in order. A take-over replaces the core (`replace`): whoever reads it reads `hold.core` each time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from gpuevents.aio import guarded_task
from rules.core.core import Core


class CoreHold:
    """The engine's core, its lock, the commit in flight (one at most) and the count of changes read models
    wait for."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.lock = asyncio.Lock()
        self.changes = 0
        """Counts what changed the core: a reader waits for a read model that saw them."""
        self._inflight: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[Core]:
        """The core, under the lock, once the commit in flight is through (raises what it raised)."""
        async with self.lock:
            await self.settle_held()
            yield self.core

    async def settle(self) -> None:
        """Wait until the batch in flight is committed and acknowledged (raises what its commit raised)."""
        async with self.lock:
            await self.settle_held()

    async def settle_held(self) -> None:
        """`settle` for one that holds the lock already."""
        task, self._inflight = self._inflight, None
        if task is not None:
            await task

    def commit_behind(self, commit: Coroutine[Any, Any, None]) -> None:
        """Start a batch's commit in the background (the lock held and the previous one settled): the next
        `held()` or `settle` awaits it and raises what it raised."""
        if self._inflight is not None:
            raise RuntimeError("one commit in flight at most: settle the previous one first")
        self._inflight = guarded_task(commit, "commit", awaited=True)

    def changed(self) -> None:
        self.changes += 1

    def replace(self, core: Core) -> None:
        """A take-over's core, restored from KV (the lock held)."""
        self.core = core
        self.changes += 1

    def describe(self, rule: str) -> str:
        """A rule's description, for the FIRING log line ("" for a rule no longer loaded)."""
        found = self.core.rules.by_name.get(rule)
        return found.spec.description or "" if found is not None else ""

    def size(self) -> int:
        """The entities and incidents the core holds (what the collector's policy weighs)."""
        core = self.core
        return sum(map(len, core.state.by_kind.values())) + sum(map(len, core.incidents.values()))
