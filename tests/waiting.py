"""Waiting for a condition with a deadline, instead of sleeping and hoping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def wait_for(condition: Callable[[], T | Awaitable[T]], timeout: float = 10.0,
                   interval: float = 0.02, what: str = "condition") -> T:
    """Poll `condition` (sync or async) until it returns something truthy; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        result = condition()
        if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
            result = await result  # type: ignore[misc]
        last = result  # type: ignore[assignment]
        if result:
            return result  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value {last!r}")
        await asyncio.sleep(interval)
