"""Fail any test that leaves asyncio tasks pending (kopf's rule): a task still running when the test and its
fixtures are done was started and never stopped; on shutdown the product would leave it running too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

SETTLE_S = 2.0  # how long tasks already cancelled (or ending) get to finish before they count as left pending


def describe(task: asyncio.Task[object]) -> str:
    """A task's name, coroutine and where it waits now."""
    frames = task.get_stack()
    where = f"{frames[-1].f_code.co_filename}:{frames[-1].f_lineno}" if frames else "not started"
    return f"{task.get_name()}: {task.get_coro()!r}, waiting at {where}"


async def left_pending(before: set[asyncio.Task[object]]) -> list[asyncio.Task[object]]:
    """The tasks of the running loop, other than the caller and those in `before`, still pending once the ones
    ending have had SETTLE_S to end."""
    rest = asyncio.all_tasks() - before - {asyncio.current_task()}
    if rest:
        await asyncio.wait(rest, timeout=SETTLE_S)
    return sorted((t for t in rest if not t.done()), key=lambda t: t.get_name())


@pytest.fixture(autouse=True)
async def no_pending_tasks() -> AsyncIterator[None]:
    """Set up before every other function-scoped fixture, so torn down after them: what is left then leaked."""
    before = asyncio.all_tasks()
    yield
    pending = await left_pending(before)
    if not pending:
        return
    said = "\n".join(describe(t) for t in pending)
    for t in pending:  # so that they do not run on into the loop's shutdown
        t.cancel()
    await asyncio.wait(pending, timeout=SETTLE_S)
    pytest.fail(f"{len(pending)} asyncio task(s) left pending by the test and its fixtures:\n{said}", pytrace=False)
