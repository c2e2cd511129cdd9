"""The task helpers: sleep-or-stop, wait_any, backoff, guarded tasks, stopping, restarting."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from gpuevents.aio import Backoff, backoff_delay, guarded_task, restarting, sleep_or_stop, stop_tasks, wait_any


async def test_sleep_or_stop_wakes_when_stop_is_set() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.call_later(0.01, stop.set)
    started = loop.time()
    assert await sleep_or_stop(stop, 30.0) is True
    assert loop.time() - started < 5.0


async def test_sleep_or_stop_says_false_after_its_time() -> None:
    assert await sleep_or_stop(asyncio.Event(), 0.01) is False


async def test_wait_any_returns_on_the_first_event_set() -> None:
    a, b = asyncio.Event(), asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, b.set)
    await asyncio.wait_for(wait_any(a, b, timeout=30.0), 5.0)
    assert b.is_set() and not a.is_set()


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    b = Backoff(0.1, 1.0, jitter=False)
    assert [b.next() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    b.reset()
    assert b.next() == 0.1


def test_backoff_jitter_stays_between_half_and_the_whole_delay() -> None:
    rng = random.Random(7)
    for attempt in range(1, 12):
        d = backoff_delay(attempt, 2.0, 300.0, rng)
        full = min(300.0, 2.0 * 2 ** (attempt - 1))
        assert full / 2 <= d <= full


async def test_a_guarded_task_that_fails_is_logged_by_name(caplog: pytest.LogCaptureFixture) -> None:
    errors: list[BaseException] = []

    async def boom() -> None:
        raise RuntimeError("bad")

    task = guarded_task(boom(), "the-boomer", on_error=errors.append)
    with pytest.raises(RuntimeError):
        await task
    await asyncio.sleep(0)  # done callbacks run on the next loop iteration
    assert "the-boomer has finished unexpectedly" in caplog.text
    assert isinstance(errors[0], RuntimeError)


async def test_stop_tasks_names_a_task_that_will_not_stop(caplog: pytest.LogCaptureFixture) -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                await release.wait()

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING):
        await stop_tasks([task], "test", timeout=0.05)
    assert "stubborn did not stop" in caplog.text
    release.set()
    await task


async def test_restarting_starts_a_failing_helper_again_until_stop() -> None:
    stop = asyncio.Event()
    runs: list[int] = []

    async def flaky() -> None:
        runs.append(1)
        if len(runs) >= 3:
            stop.set()
            return
        raise RuntimeError("flaky")

    restarts: list[str] = []
    await asyncio.wait_for(restarting("flaky", flaky, stop, backoff=Backoff(0.001, 0.002, jitter=False),
                                      on_restart=restarts.append), 5.0)
    assert len(runs) == 3
    assert restarts == ["flaky", "flaky"]
