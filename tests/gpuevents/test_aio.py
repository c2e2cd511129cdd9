"""The task helpers: sleep-or-stop, wait_any, backoff, guarded tasks and task sets, stopping, restarting; and
that no task is started anywhere else."""

from __future__ import annotations

import ast
import asyncio
import inspect
import logging
import random
from pathlib import Path

import pytest

from gpuevents.aio import (
    Backoff,
    Tasks,
    backoff_delay,
    first_of,
    guarded_task,
    restarting,
    sleep_or_stop,
    stop_tasks,
    unless_stopped,
    wait_any,
)


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


async def test_tasks_names_each_task_and_forgets_it_when_it_ends() -> None:
    tasks = Tasks("test")
    release = asyncio.Event()
    task = tasks.spawn(release.wait(), "waiting for release")
    assert task.get_name() == "waiting for release"
    assert len(tasks) == 1
    release.set()
    await task
    await asyncio.sleep(0)  # done callbacks run on the next loop iteration
    assert len(tasks) == 0 and tasks.crashes == []


async def test_tasks_logs_and_records_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []
    tasks = Tasks("test", on_error=lambda name, exc: seen.append(f"{name}: {exc}"))

    async def boom() -> None:
        raise RuntimeError("bad")

    task = tasks.spawn(boom(), "the-boomer")
    await asyncio.wait([task])
    await asyncio.sleep(0)
    assert "the-boomer has finished unexpectedly: RuntimeError: bad" in caplog.text
    assert [(name, str(exc)) for name, exc in tasks.crashes] == [("the-boomer", "bad")]
    assert seen == ["the-boomer: bad"]


async def test_tasks_stop_cancels_what_runs_and_starts_no_more() -> None:
    tasks = Tasks("test")
    cancelled: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    a, b = tasks.spawn(forever("a"), "a"), tasks.spawn(forever("b"), "b")
    await asyncio.sleep(0)
    await tasks.stop(timeout=5)
    assert a.cancelled() and b.cancelled() and sorted(cancelled) == ["a", "b"]
    assert tasks.crashes == []  # a cancelled task did not crash
    late = forever("late")
    with pytest.raises(RuntimeError, match="test is stopped: late was not started"):
        tasks.spawn(late, "late")
    assert inspect.getcoroutinestate(late) == inspect.CORO_CLOSED  # closed, not left to warn "never awaited"


async def test_an_awaited_task_leaves_its_failure_to_whoever_awaits_it(caplog: pytest.LogCaptureFixture) -> None:
    async def boom() -> None:
        raise ValueError("for the awaiter")

    task = guarded_task(boom(), "awaited", awaited=True)
    with pytest.raises(ValueError, match="for the awaiter"):
        await task
    await asyncio.sleep(0)
    assert task.get_name() == "awaited"
    assert "has finished unexpectedly" not in caplog.text


async def test_unless_stopped_runs_to_the_end_or_stops() -> None:
    ran: list[int] = []

    async def quick() -> None:
        ran.append(1)

    assert await unless_stopped(quick(), asyncio.Event(), "quick") is True and ran == [1]

    stop = asyncio.Event()
    cancelled = asyncio.Event()

    async def hangs() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    asyncio.get_running_loop().call_soon(stop.set)
    assert await unless_stopped(hangs(), stop, "hangs") is False
    assert cancelled.is_set()

    async def fails() -> None:
        raise OSError("refused")

    with pytest.raises(OSError, match="refused"):
        await unless_stopped(fails(), asyncio.Event(), "fails")


# Every task is started through gpuevents/aio.py: a raw one escapes naming, crash logging and shutdown.
RAW_SPAWNS = {"create_task", "ensure_future"}
SOURCE_PACKAGES = ("gpuevents", "rules", "actions", "agent", "deploy", "examples")


def raw_spawns(root: Path) -> list[str]:
    """`file:line: call` for each call of a raw task spawn in the source packages, gpuevents/aio.py aside."""
    found = []
    for package in SOURCE_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if path == root / "gpuevents" / "aio.py" or ".venv" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                    if name in RAW_SPAWNS:
                        found.append(f"{path.relative_to(root)}:{node.lineno}: {name}")
    return found


async def test_first_of_says_which_came_first() -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    loop.call_soon(done.set_result, 3)
    assert await first_of(done, asyncio.Event()) is True
    stop = asyncio.Event()
    loop.call_soon(stop.set)
    pending: asyncio.Future[int] = loop.create_future()
    assert await first_of(pending, stop) is False and not pending.done()


def test_no_task_is_started_outside_gpuevents_aio() -> None:
    root = Path(__file__).resolve().parents[2]
    assert raw_spawns(root) == [], "start tasks through gpuevents.aio (guarded_task or Tasks.spawn)"


def test_the_scan_finds_a_raw_spawn(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "x.py").write_text("import asyncio\n\n\ndef f(loop):\n"
                                             "    loop.create_task(g())\n    asyncio.ensure_future(g())\n")
    assert raw_spawns(tmp_path) == ["rules/x.py:5: create_task", "rules/x.py:6: ensure_future"]
