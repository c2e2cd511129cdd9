"""Task helpers: one way to start, supervise, wait on and stop asyncio tasks, and one backoff.

Every task in gpuevents is started here (tests/gpuevents/test_aio.py fails on a raw `create_task` elsewhere):
a named task through `guarded_task` (it logs when the task ends unexpectedly), or one of a `Tasks` set that
its owner stops together (kopf's style: crashes logged and recorded, the rest cancelled on shutdown). Waits
use `sleep_or_stop` / `wait_any` / `unless_stopped` (never a bare `wait_for(stop.wait())`), retries use
`Backoff`, and `stop_tasks` names what would not stop. Tasks that live and die together run in an
`asyncio.TaskGroup`; `restarting` keeps a helper alive through failures.
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
                 on_error: Callable[[BaseException], None] | None = None, awaited: bool = False) -> asyncio.Task[T]:
    """Start `coro` as a task named `name`; if it raises, log "<name> has finished unexpectedly" (and call
    `on_error`), so a failure is never lost in an unretrieved exception. `awaited`: its starter awaits it and
    takes what it raises, so the guard only names it."""
    task = asyncio.create_task(coro, name=name)
    if not awaited:
        task.add_done_callback(lambda t: _report_end(t, on_error))
    return task


class Tasks:
    """The tasks one owner starts and stops together: each named and guarded (`spawn`), its crash logged and
    recorded in `crashes`; `stop` cancels what still runs and names what would not stop."""

    def __init__(self, title: str, *, on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self.title = title
        self.crashes: list[tuple[str, BaseException]] = []  # (task name, what it raised), oldest first
        self._on_error = on_error
        self._running: set[asyncio.Task[Any]] = set()
        self._stopped = False

    def __len__(self) -> int:
        """How many of its tasks still run."""
        return len(self._running)

    def spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        """Start `coro` as a task named `name`, kept until it ends; refused once the set is stopped."""
        if self._stopped:
            coro.close()
            raise RuntimeError(f"{self.title} is stopped: {name} was not started")

        def crashed(exc: BaseException) -> None:
            self.crashes.append((name, exc))
            if self._on_error is not None:
                self._on_error(name, exc)

        task = guarded_task(coro, name, on_error=crashed)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    async def stop(self, timeout: float = 10.0) -> None:
        """Start no more; cancel what runs and wait up to `timeout` for it (naming what would not stop)."""
        self._stopped = True
        await stop_tasks(list(self._running), self.title, timeout)


async def unless_stopped(coro: Coroutine[Any, Any, None], stop: asyncio.Event, name: str) -> bool:
    """Run `coro` until it ends or `stop` is set, whichever is first: True when it ended (what it raised is
    raised), False when `stop` came first (it is then cancelled)."""
    task = guarded_task(coro, name, awaited=True)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopping], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return False
    task.result()
    return True


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


async def first_of(future: asyncio.Future[Any], stop: asyncio.Event) -> bool:
    """Wait for `future` or `stop`, whichever is first: True when `future` is done."""
    stopping: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([future, stopping], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    return future.done()


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
