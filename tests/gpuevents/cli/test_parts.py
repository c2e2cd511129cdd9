"""Running a process's parts: one that ends stops the others and is named; each runner gets the weekly summary."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gpuevents.bus import Bus
from gpuevents.cli import parts
from gpuevents.cli.common import PartFailed
from gpuevents.cli.parts import RunnerPart, run_parts, runner_parts
from gpuevents.cli.report import weekly_summary
from gpuevents.clock import SystemClock
from gpuevents.config import Config


async def test_a_part_that_fails_stops_the_others_and_is_named(caplog: pytest.LogCaptureFixture) -> None:
    stopped: list[str] = []

    async def steady(stop: asyncio.Event) -> None:
        await stop.wait()
        stopped.append("steady")

    async def broken(stop: asyncio.Event) -> None:
        raise RuntimeError("disk on fire")

    stop = asyncio.Event()
    with caplog.at_level(logging.ERROR), pytest.raises(PartFailed, match="broken stopped unexpectedly"):
        await asyncio.wait_for(run_parts({"steady": steady, "broken": broken}, stop), 10)
    assert stopped == ["steady"]
    assert "broken has finished unexpectedly" in caplog.text
    assert "disk on fire" in caplog.text


async def test_a_part_that_returns_early_stops_the_others(caplog: pytest.LogCaptureFixture) -> None:
    async def steady(stop: asyncio.Event) -> None:
        await stop.wait()

    async def quitter(stop: asyncio.Event) -> None:
        return None

    stop = asyncio.Event()
    with caplog.at_level(logging.ERROR), pytest.raises(PartFailed, match="quitter"):
        await asyncio.wait_for(run_parts({"steady": steady, "quitter": quitter}, stop), 10)
    assert stop.is_set()
    assert "quitter ended before it was told to stop" in caplog.text


async def test_a_part_that_ignores_stop_is_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parts, "PART_STOP_S", 0.05)
    cancelled: list[bool] = []

    async def stubborn(stop: asyncio.Event) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, stop.set)
    await asyncio.wait_for(run_parts({"stubborn": stubborn}, stop), 10)
    assert cancelled == [True]


async def test_every_runner_is_handed_the_weekly_summary(bus: Bus) -> None:
    made = runner_parts(Config(), bus, SystemClock(), 2)
    assert sorted(made) == ["runner0", "runner1"]
    for name, part in made.items():
        assert isinstance(part, RunnerPart)
        runner = await part.open()
        assert runner.id.startswith(f"{name}-") and runner.services.report is weekly_summary


async def test_parts_told_to_stop_end_without_error() -> None:
    async def steady(stop: asyncio.Event) -> None:
        await stop.wait()

    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, stop.set)
    await asyncio.wait_for(run_parts({"a": steady, "b": steady}, stop), 10)  # no PartFailed
