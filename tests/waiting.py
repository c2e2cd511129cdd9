"""Waiting for a condition with a deadline, instead of sleeping and hoping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


@overload
async def wait_for(condition: Callable[[], Awaitable[T | None]], timeout: float = 10.0, interval: float = 0.02,
                   what: str = "condition") -> T: ...


@overload
async def wait_for(condition: Callable[[], T | None], timeout: float = 10.0, interval: float = 0.02,
                   what: str = "condition") -> T: ...


async def wait_for(condition: Callable[[], Any], timeout: float = 10.0,
                   interval: float = 0.02, what: str = "condition") -> Any:
    """Poll `condition` (sync or async) until it returns something truthy (so not None); fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value {result!r}")
        await asyncio.sleep(interval)
