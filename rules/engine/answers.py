"""What an engine answers people with, apart from consuming: the read model (status, `free`, the dashboard),
snoozes and keeps, and a person's kill or cancel (served by rules/engine/servers.py while the engine acts)."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import TYPE_CHECKING

from gpuevents.costs import CostModel
from gpuevents.events import new_id
from gpuevents.wire import KeepReply, KeepRequest
from gpuevents.wire.manual import OperatorAction, OperatorActionReply
from rules.core.core import Snooze, StepResult
from rules.core.keeps import approving_channel, entity_gpus, entity_team, keep_approval
from rules.engine.audit import snooze_record
from rules.engine.operator import act_for
from rules.engine.read.aggregates import FleetAggregates
from rules.engine.read.readmodel import ReadModel, ReadSide, build_read_model
from rules.usage.keepbudget import BudgetUse, budgets, week_start
from rules.usage.keeps import KeepRow, KeptGpu

if TYPE_CHECKING:
    from datetime import datetime

    from gpuevents.clock import Clock
    from gpuevents.config import Config
    from rules.engine.acceptor import Acceptor
    from rules.engine.commit import Committer
    from rules.engine.hold import CoreHold
    from rules.engine.planner import TickPlanner
    from rules.lang.model import Rule
    from rules.usage.recorder import UsageRecorder


class EngineAnswers:
    """The engine's answers to people, over the core it holds (`hold`), which a take-over replaces."""

    def __init__(self, config: Config, clock: Clock, hold: CoreHold, committer: Committer, acceptor: Acceptor,
                 planner: TickPlanner, usage: UsageRecorder, partition: int | None) -> None:
        self.config = config
        self.clock = clock
        self.hold = hold
        self.committer = committer
        self.acceptor = acceptor
        self.planner = planner
        self.usage = usage
        self.partition = partition
        self.partitions = 1 if partition is None else config.engine.partitions
        self.read_side = ReadSide(self._build, lambda: hold.changes)
        """The whole read model (status pages, `free`, the dashboard), built in slices off the lock."""
        self.summary_side = ReadSide(partial(self._build, aggregates=FleetAggregates()), lambda: hold.changes)
        """The status summary's read models, from per-node counts kept between requests."""

    @property
    def degraded(self) -> str | None:
        """Why, while JetStream has no room for the engine's writes (status says so at once)."""
        return self.committer.degraded

    async def read_model(self, max_age_s: float = 0.0) -> ReadModel:
        """The fleet for status, `free` and the dashboard, built in slices off the lock
        (rules/engine/read/readmodel.py): one that saw every event consumed before this call, or with `max_age_s`
        the latest if it is that young."""
        return await self.read_side.get(max_age_s)

    async def status_summary(self) -> ReadModel:
        """The figures of `gpuevents status` (no pages), with every event consumed before this call, from the
        aggregates kept as the fleet changes (rules/engine/read/aggregates.py)."""
        return await self.summary_side.get()

    async def close(self) -> None:
        """Stop building read models (the engine stepping down)."""
        await asyncio.gather(self.read_side.close(), self.summary_side.close())

    async def _build(self, version: int, aggregates: FleetAggregates | None = None) -> ReadModel:
        costs = CostModel(self.config.costs)
        core, now = self.hold.core, self.clock.now()
        warnings = tuple(c.text() for c in self.acceptor.claims.conflicts(now))  # a node two agents claim
        if aggregates is not None:
            return await aggregates.summary(core, now, version, costs, warnings=warnings)
        return await build_read_model(core, now, version, costs, warnings=warnings)

    async def keep(self, req: KeepRequest) -> KeepReply:
        """A snooze or an owner's keep (gpuevents/wire/keeps.py), stored and audited. A keep longer than the rule's
        `snooze_max` is kept for that meanwhile, and the rest asked of the rule's approving channel."""
        async with self.hold.held() as core:
            rule = core.rules.by_name.get(req.rule)
            if rule is None:
                return KeepReply(ok=False, error=f"no rule named {req.rule!r}")
            now = self.clock.now()
            ents = core.state.entities_by_id(rule.kind, req.entity_id)
            where = ents[0].ctx["entity"] if ents else None
            cluster = where.cluster if where is not None else self.config.cluster
            team = entity_team(ents[0], self.config.costs.team_label) if ents else ""
            use = await self._budget_use(req, team, now)
            if use is not None and (over := use.over) is not None:  # the whole keep waits for the approving channel
                return await self._over_budget(rule, req, use, over, cluster, getattr(where, "node", None), now)
            s = Snooze(rule=req.rule, entity_id=req.entity_id, until=req.until, by=req.by, reason=req.reason,
                       bounded=req.keep)
            result = core.step(s, now)
            self.hold.changed()
            s = next((x for x in result.snoozes if x.rule == s.rule and x.entity_id == s.entity_id), s)  # as applied
            approving = approving_channel(rule) if s.until < req.until else None
            if approving is not None:
                result.extend(StepResult(actions=[keep_approval(
                    rule, req, approving[0], approving[1], rule.kind, cluster, getattr(where, "node", None), now,
                    new_id())]))
            await self.committer.commit(result, "commit a snooze")
            self.planner.replan()  # its end, or the evaluation it asks for, may come before the planned tick
        pending = f"; {req.until.isoformat()} awaits approval in {approving[0]}" if approving else ""
        await self.committer.audit([snooze_record(self.clock.now(), s, pending, cluster)])
        if req.keep or req.approved_by or s.until <= now:
            gpus = tuple(KeptGpu(n, i) for e in ents[:1] for n, i in entity_gpus(e))
            row = KeepRow(id=new_id(), cluster=cluster, rule=s.rule, entity_id=s.entity_id, gpus=gpus, by=req.by,
                          reason=req.reason, start=now.timestamp(), until=s.until.timestamp(),
                          asked_until=req.until.timestamp(), approved_by=req.approved_by, team=team)
            await self.usage.record_keep(row)  # for the weekly report: a lift ends the keep
        return KeepReply(ok=True, until=s.until, asked_until=req.until, snooze_max_s=rule.snooze_max_s,
                         approval=approving[0] if approving else None,
                         admins=list(self.config.actions.slack.admins), budget=use.text() if use else None)

    async def _budget_use(self, req: KeepRequest, team: str, now: datetime) -> BudgetUse | None:
        """This week's keeps of the owner and the team, where a budget applies to them (None: none does)."""
        owner_budget, team_budget = budgets(self.config, req.by, team)
        if not req.keep or req.approved_by or (owner_budget is None and team_budget is None):
            return None
        since = week_start(now, self.config.engine.timezone).timestamp()
        owner_used, team_used = await self.usage.keeps_taken(since, req.by, team)
        return BudgetUse(req.by, owner_used, owner_budget, team, team_used, team_budget)

    async def _over_budget(self, rule: Rule, req: KeepRequest, use: BudgetUse, over: str, cluster: str,
                           node: str | None, now: datetime) -> KeepReply:
        """Past the budget: nothing kept; the rule's approving channel is asked for the whole keep."""
        approving = approving_channel(rule)
        admins = list(self.config.actions.slack.admins)
        if approving is None:
            return KeepReply(ok=False, error=f"past the keep budget ({over}) and the rule names no approving "
                             f"channel: ask {', '.join(admins) or 'whoever runs gpuevents'}", admins=admins,
                             budget=use.text(), over_budget=over)
        ask = keep_approval(rule, req, approving[0], approving[1], rule.kind, cluster, node, now, new_id(),
                            over_budget=over)
        await self.committer.commit(StepResult(actions=[ask]), "ask to approve a keep past its budget")
        return KeepReply(ok=True, until=None, asked_until=req.until, snooze_max_s=rule.snooze_max_s,
                         approval=approving[0], admins=admins, budget=use.text(), over_budget=over)

    async def operator_action(self, req: OperatorAction) -> OperatorActionReply | None:
        """A person's kill or cancel, decided like a rule's action (rules.engine.operator)."""
        async with self.hold.held() as core:
            return await act_for(req, core, self.config, self.committer, self.clock.now(), self.partition)

