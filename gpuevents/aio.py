"""Task helpers: one way to start, supervise, wait on and stop asyncio tasks, and one backoff.

Everything long-running in gpuevents is a named task started through `guarded_task` (it logs when the
task ends unexpectedly), waits with `sleep_or_stop` / `wait_any` (never a bare `wait_for(stop.wait())`),
retries with `Backoff`, and is stopped with `stop_tasks` (which names what would not stop). Tasks that
live and die together run in an `asyncio.TaskGroup`; `restarting` keeps a helper alive through failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`, waking early when `stop` is set; True when `stop` is set."""
    if stop.is_set():
        return True
    if seconds > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


async def wait_any(*events: asyncio.Event, timeout: float | None = None) -> None:
    """Return when any of `events` is set, or after `timeout` seconds."""
    if any(e.is_set() for e in events):
        return
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None,
                  jitter: bool = True) -> float:
    """The delay before retry `attempt` (1, 2, ...): d = min(cap, base * 2^(attempt-1)), with jitter in [d/2, d]."""
    d = min(cap, base * (2.0 ** min(max(attempt, 1) - 1, 62)))
    if not jitter:
        return d
    return d / 2 + (rng.random() if rng is not None else random.random()) * d / 2


class Backoff:
    """A growing delay between retries: `base`, doubling up to `cap`, with jitter; `reset` after a success."""

    def __init__(self, base: float = 0.1, cap: float = 5.0, *, jitter: bool = True,
                 rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = cap
        self.jitter = jitter
        self.attempts = 0
        self._rng = rng

    def next(self) -> float:
        """The delay before the next retry (and count one failure)."""
        self.attempts += 1
        return backoff_delay(self.attempts, self.base, self.cap, self._rng, self.jitter)

    def reset(self) -> None:
        self.attempts = 0

    async def sleep(self, stop: asyncio.Event | None = None) -> bool:
        """Wait the next delay (waking early on `stop`); True when `stop` is set."""
        delay = self.next()
        if stop is None:
            await asyncio.sleep(delay)
            return False
        return await sleep_or_stop(stop, delay)


def _report_end(task: asyncio.Task[Any], on_error: Callable[[BaseException], None] | None) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("%s has finished unexpectedly: %s: %s", task.get_name(), type(exc).__name__, exc,
                  exc_info=exc)
        if on_error is not None:
            on_error(exc)


def guarded_task(coro: Coroutine[Any, Any, T], name: str, *,
                 on_error: Callable[[BaseException], None] | None = None) -> asyncio.Task[T]:
    """Start `coro` as a task named `name`; if it raises, log "<name> has finished unexpectedly" (and call
    `on_error`), so a failure is never lost in an unretrieved exception."""
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(lambda t: _report_end(t, on_error))
    return task


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]], title: str, timeout: float = 10.0) -> None:
    """Cancel `tasks` and wait up to `timeout` for them to end; log the names of any that would not."""
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        t.cancel()
    if not pending:
        return
    _, still = await asyncio.wait(pending, timeout=timeout)
    if still:
        log.warning("%s: %s did not stop within %.0fs", title, ", ".join(sorted(t.get_name() for t in still)),
                    timeout)


async def until_stop_or_end(tasks: Iterable[asyncio.Task[Any]], stop: asyncio.Event, what: str) -> None:
    """Return when `stop` is set or one of `tasks` ends: a failure is raised (its guard has logged it), an end
    without `stop` is logged by name; either way `what` should then stop."""
    stopped = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait([*tasks, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    for t in done:
        if t is stopped or t.cancelled():
            continue
        if (error := t.exception()) is not None:
            raise error
        if not stop.is_set():
            log.error("%s has finished unexpectedly; %s stops", t.get_name(), what)


async def restarting(name: str, run: Callable[[], Awaitable[None]], stop: asyncio.Event, *,
                     backoff: Backoff | None = None, healthy_after_s: float = 60.0,
                     on_restart: Callable[[str], None] | None = None) -> None:
    """Run `run()` until `stop` is set; whenever it fails or returns early, log it and start it again after
    a growing delay (reset once a run lasted `healthy_after_s`)."""
    backoff = backoff or Backoff(1.0, 60.0, jitter=False)
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        started = loop.time()
        try:
            await run()
        except Exception as e:
            why = f"failed: {type(e).__name__}: {e}"
            log.debug("%s failed", name, exc_info=True)
        else:
            if stop.is_set():
                return
            why = "returned unexpectedly"
        if loop.time() - started > healthy_after_s:
            backoff.reset()
        if on_restart is not None:
            on_restart(name)
        delay = backoff.next()
        log.error("%s %s; restarting it in %.1fs", name, why, delay)
        if await sleep_or_stop(stop, delay):
            return
