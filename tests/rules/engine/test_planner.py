"""When the engine ticks: at once when the core is due, else at the earlier of the core's next wake-up and the
periodic tick; a step that makes a deadline due before the planned tick, or a replan, wakes the loop early; a
deadline after it does not. On a virtual clock, with a real core."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from gpuevents.clock import ManualClock
from rules.core.core import Core
from rules.core.inputs import Tick
from rules.engine.planner import TickPlanner
from tests.rules.helpers import T0, at, held_idle, idle_core
from tests.waiting import wait_for


def ticked(tmp_path: Path, extra: str) -> Core:
    """A core with an idle rule (`extra` adds its `for:`), swept once at T0: it next wakes at T0 + 30 s."""
    core = idle_core(tmp_path, extra)
    core.step(Tick(), at(0))
    assert core.next_wakeup(T0) == T0 + timedelta(seconds=30)
    return core


async def planned_wait(planner: TickPlanner, core: Core, stop: asyncio.Event,
                       until: float) -> asyncio.Task[bool]:
    task = asyncio.create_task(planner.wait(core, stop))
    await wait_for(lambda: planner.planned == until or task.done(), what="the loop to plan its tick")
    assert planner.planned == until
    return task


async def test_a_core_that_is_due_is_ticked_at_once(tmp_path: Path) -> None:
    planner = TickPlanner(ManualClock(T0), 3600)
    assert await planner.wait(idle_core(tmp_path), asyncio.Event()) is True  # never swept: due now
    assert planner.planned == 0.0


async def test_the_loop_waits_for_the_earlier_of_the_cores_wakeup_and_the_tick(tmp_path: Path) -> None:
    core, stop = ticked(tmp_path, "for: 2m"), asyncio.Event()
    long = TickPlanner(ManualClock(T0), 3600)
    long_tick = await planned_wait(long, core, stop, (T0 + timedelta(seconds=30)).timestamp())
    short = TickPlanner(ManualClock(T0), 5)
    short_tick = await planned_wait(short, core, stop, (T0 + timedelta(seconds=5)).timestamp())
    stop.set()
    assert await long_tick is False and await short_tick is False
    assert short.planned == 0.0


async def test_a_step_that_makes_a_deadline_due_before_the_planned_tick_wakes_the_loop(tmp_path: Path) -> None:
    core, stop = ticked(tmp_path, "for: 10s"), asyncio.Event()
    planner = TickPlanner(ManualClock(T0), 3600)
    task = await planned_wait(planner, core, stop, (T0 + timedelta(seconds=30)).timestamp())
    core.step(held_idle(), at(0))
    assert core.timers.next_deadline == T0 + timedelta(seconds=10)
    planner.stepped(core)
    assert await task is False and not stop.is_set()
    again = await planned_wait(planner, core, stop, (T0 + timedelta(seconds=10)).timestamp())
    stop.set()
    await again


async def test_a_deadline_after_the_planned_tick_leaves_the_loop_waiting(tmp_path: Path) -> None:
    core, stop = ticked(tmp_path, "for: 2m"), asyncio.Event()
    planner = TickPlanner(ManualClock(T0), 3600)
    task = await planned_wait(planner, core, stop, (T0 + timedelta(seconds=30)).timestamp())
    core.step(held_idle(), at(0))
    planner.stepped(core)
    for _ in range(5):
        await asyncio.sleep(0)  # let a woken wait return, if it was woken
    assert not task.done()
    planner.replan()  # a snooze or a reload: plan again
    assert await task is False and not stop.is_set()
