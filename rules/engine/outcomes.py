"""The runners' outcomes of warnings, read from the audit stream and fed back to the core
(rules/core/warning_ledger.py).

Live: every audit message the acting engine receives. On taking over: the audit stream is read again from the
oldest warning whose outcome the restored incidents do not know, so an outcome reported while no engine was
acting still counts."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.records import decode_audit
from rules.core.core import Core, StepResult
from rules.core.incidents import Incident
from rules.core.warning_ledger import ActionOutcome
from rules.engine.commit import Committer

REPLAY_AT_MOST = timedelta(days=2)
"""How far back a new acting engine reads the audit stream for outcomes (stages are hours after firing)."""


def warning_outcomes(payload: bytes) -> list[ActionOutcome]:
    """The warning outcomes an audit message reports (most messages report none, and are not parsed)."""
    if b'"action"' not in payload or b'"action_type"' not in payload:  # warnings', and refusals freeing a slot
        return []
    return [o for r in decode_audit(payload) if (o := ActionOutcome.of(r)) is not None]


def awaiting_since(incidents: Iterable[Incident], now: datetime) -> datetime | None:
    """When the oldest warning whose outcome is not known was sent (bounded by REPLAY_AT_MOST), or None."""
    starts = [i.fired_at or i.active_at for i in incidents
              if i.open and any(w.status == "sent" for w in i.warnings.values())]
    if not starts:
        return None
    return max(min(starts), now - REPLAY_AT_MOST)


async def learn(core: Core, committer: Committer, now: datetime, outcomes: list[ActionOutcome]) -> None:
    """Feed warning outcomes to the core and persist the incidents they changed (the engine's lock is held)."""
    result = StepResult()
    for o in outcomes:
        result.extend(core.step(o, now))
    if result.incidents:
        await committer.commit(result, "commit the outcome of a warning")


async def replayed_outcomes(bus: Bus, since: datetime) -> list[ActionOutcome]:
    """The warning outcomes in the audit stream since `since`, oldest first."""
    out: list[ActionOutcome] = []
    async for msg in bus.replay(S.STREAM_AUDIT, S.AUDIT_ALL, since):
        # a slot given back was given back once, live (and persisted with the windows)
        out += [o for o in warning_outcomes(msg.data) if not o.slot_freed]
    return out
