"""A virtual-clock run of the core: timed inputs merged with the ticks the core asks for, actions recorded.

The same loop serves `rules test` (inputs from test snapshots) and a backtest (inputs from the recorded
event stream): `replay(core, inputs, start=..., end=...)`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from actions import registry
from gpuevents.clock import utc
from gpuevents.durations import format_duration
from gpuevents.records import ActionRequest
from rules.core.core import Core, CoreInput, EvalProblem, Tick
from rules.core.incidents import Transition
from rules.core.warning_ledger import assume_delivered

RAN = ("run", "dry_run")


@dataclass
class Recording:
    """Everything a run did, in order."""

    start: datetime
    transitions: list[Transition] = field(default_factory=list)
    actions: list[ActionRequest] = field(default_factory=list)
    errors: list[EvalProblem] = field(default_factory=list)
    steps: int = 0

    def transitions_of(self, rule: str, entity_id: str) -> list[Transition]:
        return [t for t in self.transitions if t.rule == rule and t.entity_id == entity_id]

    def actions_of(self, rule: str, entity_id: str) -> list[ActionRequest]:
        return [a for a in self.actions if a.rule == rule and a.entity_id == entity_id]

    def offset(self, t: datetime) -> str:
        return "+" + format_duration((t - self.start).total_seconds()).replace(" ", "")

    def timeline(self, rule: str, entity_id: str) -> list[str]:
        """`+2h pending → firing`, `+2h slack (run) to=alice`: one line per transition or action."""
        rows: list[tuple[datetime, int, str]] = []
        for t in self.transitions_of(rule, entity_id):
            why = f" ({t.reason})" if t.reason else ""
            rows.append((t.time, 0, f"{self.offset(t.time)} {t.from_status} → {t.to_status}{why}"))
        for a in self.actions_of(rule, entity_id):
            params = ", ".join(f"{k}={v!r}" for k, v in registry.readable(a.type, a.params).items())
            reason = f" — {a.reason}" if a.reason and a.decision not in RAN else ""
            rows.append((a.created_at, 1,
                         f"{self.offset(a.created_at)} {a.phase} {a.type} [{a.decision}]{reason} {params}"))
        rows.sort(key=lambda r: (r[0], r[1]))
        return [r[2] for r in rows] or ["(no incident)"]


def replay(
    core: Core, inputs: Iterable[tuple[datetime, CoreInput]], *, start: datetime, end: datetime,
    recording: Recording | None = None,
) -> Recording:
    """Step `core` through `inputs` (sorted by time) and every wakeup it asks for, from `start` to `end`.

    At an instant with both, inputs go first, then one Tick."""
    rec = recording or Recording(start=utc(start))
    now = utc(start)
    end = utc(end)
    pending = iter(sorted(inputs, key=lambda x: utc(x[0])))
    nxt = next(pending, None)
    first = True
    while True:
        wake = now if first else core.next_wakeup(now)
        if not first and wake <= now:
            wake = now + timedelta(seconds=max(core.tick_s, 1.0))
        t = wake
        if nxt is not None and utc(nxt[0]) < t:
            t = max(utc(nxt[0]), now)
        if t > end:
            break
        while nxt is not None and utc(nxt[0]) <= t:
            _step(core, rec, nxt[1], t)
            nxt = next(pending, None)
        _step(core, rec, Tick(), t)
        now = t
        first = False
    return rec


def _step(core: Core, rec: Recording, item: CoreInput, t: datetime) -> None:
    """One step, recorded; a warning decided `run` is then delivered, as a runner would report it (a rule test
    sees an undelivered warning where the engine decides one: rendered `to` empty, refused, suppressed)."""
    result = core.step(item, t)
    _record(rec, result)
    assume_delivered(core, result, t)


def _record(rec: Recording, result: object) -> None:
    from rules.core.core import StepResult

    assert isinstance(result, StepResult)
    rec.transitions += result.transitions
    rec.actions += result.actions
    rec.errors += result.errors
    rec.steps += 1
