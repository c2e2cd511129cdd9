"""When the engine ticks: at the core's next wakeup (a `for` or repeat deadline, a cron instant, a node going
offline...) or after `engine.tick` at the latest, and earlier whenever a step makes a deadline due before the
tick the loop waits for (a `for` an event started fires at its instant, not at the next periodic tick)."""

from __future__ import annotations

import asyncio

from gpuevents.aio import wait_any
from gpuevents.clock import Clock
from rules.core.core import Core


class TickPlanner:
    def __init__(self, clock: Clock, tick_s: float) -> None:
        self.clock = clock
        self.tick_s = tick_s
        self._replan = asyncio.Event()
        self._planned = 0.0  # epoch seconds of the tick the loop waits for; 0 while it is not waiting

    async def wait(self, core: Core, stop: asyncio.Event) -> bool:
        """Wait for the next tick; True when it is due, False when the plan changed or `stop` was set."""
        now = self.clock.now()
        wake = min(core.next_wakeup(now).timestamp() - now.timestamp(), self.tick_s)
        if wake <= 0:
            return True
        self._planned = now.timestamp() + wake
        self._replan.clear()
        await wait_any(stop, self._replan, timeout=wake)
        self._planned = 0.0
        return not (stop.is_set() or self._replan.is_set())

    @property
    def planned(self) -> float:
        """Epoch seconds (on the engine's clock) of the tick the loop waits for; 0 while it is not waiting."""
        return self._planned

    def stepped(self, core: Core) -> None:
        """After a step: wake the loop if the core's earliest deadline comes before the planned tick."""
        deadline = core.timers.next_deadline
        if deadline is not None and deadline.timestamp() < self._planned:
            self._replan.set()

    def replan(self) -> None:
        """Something (a snooze, a reload) may want a tick before the planned one: plan again."""
        self._replan.set()
