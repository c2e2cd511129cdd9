"""The live dashboard's source over this process's engines: their read models, never the cores themselves."""

from __future__ import annotations

import heapq

from gpuevents.costs import CostModel
from gpuevents.records import AuditRecord
from rules.dashboard.fleet_view import FleetRows
from rules.engine.read.readmodel import ReadModel
from rules.engine.service import Engine

MAX_AGE_S = 2.0  # a dashboard polling every second or two shares one read model rather than asking a new one


class EngineDashboardSource:
    """The dashboard's view (rules.dashboard.fleet_view.DashboardSource) of one engine, or of the partitions a
    replica acts for."""

    def __init__(self, engines: Engine | list[Engine] | tuple[Engine, ...]) -> None:
        self.engines: list[Engine] = list(engines) if isinstance(engines, list | tuple) else [engines]
        if not self.engines:
            raise ValueError("a dashboard needs at least one engine")
        self.engine = self.engines[0]
        self.costs = CostModel(self.engine.config.costs)

    def _acting(self) -> list[Engine]:
        return [e for e in self.engines if len(self.engines) == 1 or e.leader.is_set()]

    async def _models(self) -> list[ReadModel]:
        return [await e.answers.read_model(MAX_AGE_S) for e in self._acting()]

    async def fleet(self) -> FleetRows:
        models = await self._models()
        if len(models) == 1:
            return models[0].fleet_rows()
        now = self.engine.clock.now()
        if not models:
            return FleetRows(time=now, currency=self.costs.currency, team_label=self.costs.costs.team_label)
        held = sum(m.summary.held_idle_cost_per_hour for m in models)
        rows = heapq.merge(*(zip(m.node_keys, m.node_json, strict=True) for m in models), key=lambda r: r[0])
        return FleetRows(time=now, currency=self.costs.currency, team_label=self.costs.costs.team_label,
                         held_idle_cost_per_hour=held, held_idle_cost_per_hour_text=self.costs.format(held),
                         gpu_count=sum(m.summary.gpus for m in models), busy=sum(m.summary.busy for m in models),
                         idle=sum(m.summary.idle for m in models),
                         held_idle=sum(m.summary.held_idle for m in models), node_json=[raw for _k, raw in rows],
                         demand=[d for m in models for d in m.demand])  # one engine reads it; the others have none

    async def incidents(self) -> list[bytes]:
        """The firing incidents (as JSON), most costly first, then the longest firing."""
        models = await self._models()
        if len(models) == 1:
            return models[0].firing()
        ranked = heapq.merge(*(zip(zip(m.firing_cost, m.firing_since, strict=True), m.firing(), strict=True)
                               for m in models), key=lambda x: x[0])
        return [raw for _rank, raw in ranked]

    def recent_audit(self, limit: int) -> list[AuditRecord]:
        tails = [r for e in self.engines if e.leader.is_set() or len(self.engines) == 1 for r in e.audit_tail]
        return list(reversed(sorted({r.id: r for r in tails}.values(), key=lambda r: r.time)[-limit:]))
