"""What an engine answers people with, apart from consuming: the read model (status, `free`, the dashboard),
snoozes and keeps, and a person's kill or cancel; mixed into `Engine` (rules/engine/service.py)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from gpuevents.costs import CostModel
from gpuevents.manual import OperatorAction, OperatorActionReply
from rules.core.core import Snooze
from rules.engine.audit import snooze_record
from rules.engine.operator import act_for
from rules.engine.readmodel import ReadModel, build_read_model, empty_model

if TYPE_CHECKING:
    from gpuevents.clock import Clock
    from gpuevents.config import Config
    from rules.core.core import Core
    from rules.engine.commit import Committer
    from rules.engine.intake import Intake
    from rules.engine.planner import TickPlanner
    from rules.engine.readmodel import ReadSide


class EngineAnswers:
    """The engine's answers to people; the state they read is the engine's own (declared here for the types)."""

    config: Config
    clock: Clock
    core: Core | None
    intake: Intake
    planner: TickPlanner
    partition: int | None
    read_side: ReadSide
    _lock: asyncio.Lock
    _changes: int

    @property
    def committer(self) -> Committer:
        raise NotImplementedError

    async def _settle(self) -> None:
        raise NotImplementedError

    async def read_model(self, max_age_s: float = 0.0) -> ReadModel:
        """The fleet for status, `free` and the dashboard, built in slices off the lock (rules/engine/readmodel.py):
        one that saw every event consumed before this call, or with `max_age_s` the latest if it is that young."""
        return await self.read_side.get(max_age_s)

    async def _build_read_model(self, version: int) -> ReadModel:
        costs = CostModel(self.config.costs)
        if self.core is None:
            return empty_model(self.clock.now(), costs, version)
        now = self.clock.now()
        warnings = tuple(c.text() for c in self.intake.claims.conflicts(now))  # a node two agents claim
        return await build_read_model(self.core, now, version, costs, warnings=warnings)

    async def snooze(self, s: Snooze) -> dict[str, Any]:
        """Exempt `s.entity_id` from `s.rule` until `s.until` (`gpuevents snooze`); stored and audited."""
        async with self._lock:
            await self._settle()
            assert self.core is not None
            if s.rule not in self.core.rules.by_name:
                return {"ok": False, "error": f"no rule named {s.rule!r}"}
            asked = s.until
            result = self.core.step(s, self.clock.now())
            self._changes += 1
            s = next((x for x in result.snoozes if x.rule == s.rule and x.entity_id == s.entity_id), s)  # as applied
            cap = self.core.rules.by_name[s.rule].snooze_max_s
            await self.committer.commit(result, "commit a snooze")
            self.planner.replan()  # its end, or the evaluation it asks for, may come before the planned tick
        await self.committer.audit([snooze_record(self.clock.now(), s)])
        # A keep longer than the rule's snooze_max is cut to it: the answer says so (`capped`, the maximum).
        return {"ok": True, "until": s.until.isoformat(), "asked_until": asked.isoformat(),
                "capped": s.until < asked, "snooze_max_s": cap}

    async def operator_action(self, req: OperatorAction) -> OperatorActionReply | None:
        """A person's kill or cancel, decided like a rule's action (rules.engine.operator)."""
        async with self._lock:
            await self._settle()
            assert self.core is not None
            return await act_for(req, self.core, self.config, self.committer, self.clock.now(), self.partition)

