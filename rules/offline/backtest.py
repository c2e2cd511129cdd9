"""`gpuevents rules backtest`: stream the recorded events through rules, actions recorded and not run.

Stages are decided as the engine decides them: a staged remedy waits for a warning to be delivered, and a
warning's delivery is what the live runners recorded for it in the audit stream (its key is the engine's: the
same events make the same incident ids), so a warning that failed or was only printed then is undelivered
here too and the stage after it shows `refused`, as it was. A warning no runner recorded counts as delivered.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path

from pydantic import BaseModel, ValidationError

from gpuevents import subjects as S
from gpuevents.bus import CLIENT_CONNECT_S, Bus, BusError, StoredMsg
from gpuevents.config import Config
from gpuevents.durations import format_duration
from gpuevents.events import Event, encode_event
from gpuevents.records import Outcome, decode_audit
from rules.core.core import Core, StepResult, Tick
from rules.core.inputs import WARNING_TYPES
from rules.core.warning_ledger import assume_delivered, remember_outcome
from rules.intake.decoder import RepeatDecoder
from rules.intake.skew import believable
from rules.lang.loader import load_rule_set
from rules.offline.replay import RAN, Recording


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
    replay_events_per_s: float | None = None
    rules: list[RuleSummary]
    incidents: list[FiredIncident]
    first_event_at: datetime | None = None
    note: str = ""
    """Said when the window holds no events, or holds them only from late on: counts of 0 are not "all quiet"."""


NO_EVENTS_WHY = ("backtests replay the events agents published (stream GPUEVENTS); `gpuevents simulate "
                 "--history` writes hourly usage rollups for reports, not events. Let agents (or `gpuevents up "
                 "--demo`) run, then backtest that window")


def coverage_note(start: datetime, end: datetime, first_event_at: datetime | None, events: int) -> str:
    """What the window really held, when it is less than asked: no events at all, or none for a good part."""
    if events == 0:
        return f"the window holds no events, so no rule could fire: {NO_EVENTS_WHY}"
    if first_event_at is None:
        return ""
    gap = (first_event_at - start).total_seconds()
    window = max((end - start).total_seconds(), 1.0)
    if gap < 3600 or gap < 0.1 * window:
        return ""
    return (f"events only from {first_event_at:%Y-%m-%d %H:%M} UTC on: the {format_duration(gap)} before holds "
            f"none (the stream's retention, or nothing was recorded; simulated history is rollups, not events)")


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


class StreamSummary:
    """What a backtest keeps while it streams: the incidents that fired and what their actions would have
    been, never the events themselves (a week of a large fleet does not fit in memory)."""

    def __init__(self, start: datetime, outcomes: dict[str, Outcome] | None = None) -> None:
        self.rec = Recording(start=start)
        self.outcomes: dict[str, Outcome] = outcomes or {}
        """What the live runners recorded for warnings, by key (`warning_outcomes`)."""

    def add(self, result: StepResult) -> None:
        self.rec.transitions += [t for t in result.transitions if t.to_status in ("firing", "resolved")]
        self.rec.actions += [a.model_copy(update={"facts": {}, "params": {}}) for a in result.actions]
        self.rec.steps += 1


def tick_until(core: Core, now: datetime, until: datetime, summary: StreamSummary) -> datetime:
    """Tick `core` at every instant it asks for after `now`, up to `until`; the last instant ticked (or `now`)."""
    while True:
        wake = core.next_wakeup(now)
        if wake <= now:
            wake = now + timedelta(seconds=max(core.tick_s, 1.0))
        if wake > until:
            return now
        result = core.step(Tick(), wake)
        summary.add(result)
        assume_delivered(core, result, wake, summary.outcomes)  # as the runners recorded, else delivered
        now = wake


async def stream_backtest(core: Core, messages: AsyncIterator[StoredMsg], start: datetime, end: datetime,
                          summary: StreamSummary, progress: Callable[[StoredMsg], None] | None = None,
                          max_skew_s: float = 60.0) -> tuple[int, int]:
    """Step `core` through the stored messages in the order the engine got them, each at its own time (or, from
    an agent whose clock was off, the time NATS stored it; never going back), and through the ticks the core
    asks for in between, as the engine would have; (events, malformed)."""
    decoder = RepeatDecoder()
    now, events, malformed = start, 0, 0
    async for m in messages:
        if progress is not None:
            progress(m)
        try:
            event = decoder.decode(m.data)
        except ValidationError:
            malformed += 1
            continue
        decoder.accepted(event)
        when = event.time
        if m.time is not None and not believable((when - m.time).total_seconds(), max_skew_s):
            when = m.time
        t = max(now, when)
        now = tick_until(core, now, t, summary)
        result = core.step(event, t)
        summary.add(result)
        assume_delivered(core, result, t, summary.outcomes)
        now = t
        events += 1
    tick_until(core, now, end, summary)
    return events, malformed


async def stored(events: Iterable[Event]) -> AsyncIterator[StoredMsg]:
    """Events as the stream would have held them (readings rebuilt from another store's history, say)."""
    for seq, event in enumerate(events, 1):
        yield StoredMsg(subject=f"rebuilt.{event.type}", data=encode_event(event), seq=seq, time=event.time)


async def backtest_events(config: Config, paths: Sequence[Path], events: Iterable[Event], start: datetime,
                          end: datetime, note: str = "") -> BacktestReport:
    """Step the rules in `paths` through `events` (in time order) from `start` to `end`, as through the stream."""
    rules = load_rule_set(paths, default_timezone=config.engine.timezone)
    core = Core(rules, config)
    summary = StreamSummary(start)
    first_at: list[datetime] = []

    def seen(m: StoredMsg) -> None:
        if not first_at and m.time is not None:
            first_at.append(m.time)

    started = time.monotonic()
    count, malformed = await stream_backtest(core, stored(events), start, end, summary, seen,
                                             float(config.engine.max_clock_skew))
    elapsed = max(time.monotonic() - started, 1e-9)
    report = summarize(summary.rec, [r.name for r in rules], start, end, count, malformed)
    first = first_at[0] if first_at else None
    return report.model_copy(update={"replay_events_per_s": round(count / elapsed, 1), "first_event_at": first,
                                     "note": note or coverage_note(start, end, first, count)})


async def warning_outcomes(messages: AsyncIterator[StoredMsg]) -> dict[str, Outcome]:
    """The runners' outcomes of warnings (`slack`, `email`, `notify`) in the audit messages, by action key."""
    known: dict[str, Outcome] = {}
    async for m in messages:
        for r in decode_audit(m.data):
            if r.kind == "action" and r.action_type in WARNING_TYPES and r.action_key and r.outcome:
                remember_outcome(known, r.action_key, r.outcome)
    return known


async def run_backtest(config: Config, paths: Sequence[Path], since_s: float, now: datetime,
                       progress: Callable[[int, int], None] | None = None) -> BacktestReport:
    """Stream GPUEVENTS from `now - since_s` through the rules in `paths` (`progress(done, total)` as it goes)."""
    rules = load_rule_set(paths, default_timezone=config.engine.timezone)
    start = now - timedelta(seconds=since_s)
    core = Core(rules, config)
    summary = StreamSummary(start)
    started = time.monotonic()
    async with Bus(config.nats, name="gpuevents-backtest", give_up_after=CLIENT_CONNECT_S) as bus:
        with contextlib.suppress(BusError):  # no audit stream: every warning counts as delivered
            summary.outcomes = await warning_outcomes(bus.replay(S.STREAM_AUDIT, S.AUDIT_ALL, since=start))
        first_seq: list[int] = []
        last_seq = 0
        with contextlib.suppress(BusError):
            last_seq = (await bus.stream_info(S.STREAM_EVENTS)).state.last_seq

        first_at: list[datetime] = []

        def seen(m: StoredMsg) -> None:
            if not first_seq:
                first_seq.append(m.seq)
                if m.time is not None:
                    first_at.append(m.time)
            if progress is not None:
                progress(m.seq - first_seq[0] + 1, max(1, last_seq - first_seq[0] + 1))

        events, malformed = await stream_backtest(
            core, bus.replay(S.STREAM_EVENTS, S.EVENTS_ALL, since=start), start, now, summary, seen,
            float(config.engine.max_clock_skew))
    elapsed = max(time.monotonic() - started, 1e-9)
    report = summarize(summary.rec, [r.name for r in rules], start, now, events, malformed)
    first = first_at[0] if first_at else None
    return report.model_copy(update={"replay_events_per_s": round(events / elapsed, 1), "first_event_at": first,
                                     "note": coverage_note(start, now, first, events)})
