"""`gpuevents rules backtest`: replay the recorded event stream through rules, actions recorded and not run."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path

from pydantic import BaseModel, ValidationError

from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.config import Config
from gpuevents.events import Event, decode_event
from rules.core.core import Core
from rules.lang.loader import load_rule_set
from rules.offline.replay import RAN, Recording, replay


class FiredIncident(BaseModel):
    rule: str
    entity_id: str
    fired_at: datetime
    resolved_at: datetime | None = None
    actions: list[str] = []
    held_or_suppressed: int = 0


class RuleSummary(BaseModel):
    rule: str
    fired: int
    entities: int
    actions_run: int
    actions_held_or_suppressed: int


class BacktestReport(BaseModel):
    start: datetime
    end: datetime
    events: int
    malformed: int
    rules: list[RuleSummary]
    incidents: list[FiredIncident]


def backtest(core: Core, events: Iterable[Event], start: datetime, end: datetime) -> Recording:
    """Step `core` through `events` at the times they were observed, and its ticks, on a virtual clock."""
    return replay(core, ((e.time, e) for e in events), start=start, end=end)


def summarize(rec: Recording, rule_names: Sequence[str], start: datetime, end: datetime,
              events: int, malformed: int) -> BacktestReport:
    incidents: dict[str, FiredIncident] = {}
    for t in rec.transitions:
        if t.to_status == "firing":
            incidents[t.incident_id] = FiredIncident(rule=t.rule, entity_id=t.entity_id, fired_at=t.time)
        elif t.to_status == "resolved" and t.incident_id in incidents:
            incidents[t.incident_id].resolved_at = t.time
    for a in rec.actions:
        inc = incidents.get(a.incident_id)
        if inc is None:
            continue
        if a.decision in RAN:
            inc.actions.append(f"{a.phase}:{a.type}")
        else:
            inc.held_or_suppressed += 1
    summaries = []
    for name in rule_names:
        mine = [i for i in incidents.values() if i.rule == name]
        summaries.append(RuleSummary(
            rule=name, fired=len(mine), entities=len({i.entity_id for i in mine}),
            actions_run=sum(len(i.actions) for i in mine),
            actions_held_or_suppressed=sum(i.held_or_suppressed for i in mine)))
    return BacktestReport(start=start, end=end, events=events, malformed=malformed, rules=summaries,
                          incidents=sorted(incidents.values(), key=lambda i: i.fired_at))


async def run_backtest(config: Config, paths: Sequence[Path], since_s: float, now: datetime) -> BacktestReport:
    """Read GPUEVENTS from `now - since_s` and replay it through the rules in `paths`."""
    rules = load_rule_set(paths, default_timezone=config.engine.timezone)
    start = now - timedelta(seconds=since_s)
    events: list[Event] = []
    malformed = 0
    async with Bus(config.nats, name="gpuevents-backtest") as bus:
        async for m in bus.replay(S.STREAM_EVENTS, S.EVENTS_ALL, since=start):
            try:
                events.append(decode_event(m.data))
            except ValidationError:
                malformed += 1
    events.sort(key=lambda e: e.time)
    if events:
        start = min(start, events[0].time)
    end = max([now, *(e.time for e in events[-1:])])
    core = Core(rules, config)
    rec = backtest(core, events, start, end)
    return summarize(rec, [r.name for r in rules], start, end, len(events), malformed)
