"""Malformed events: to `gpuevents.dlq.>` with the reason, counted under a fixed set of kinds, logged sparingly.

What a node sends is untrusted: neither a metric label nor a log line may take its shape from the event. The
`kind` label comes from `KINDS` only (the exact reason travels in the dead letter's header), and the log says
the first event of each kind at once, then at most one summary line per kind and `summary_every` seconds."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

from pydantic import ValidationError

from gpuevents import subjects as S
from gpuevents.bus import Bus, BusError
from rules.engine.metrics import EngineMetrics

log = logging.getLogger(__name__)

Kind = Literal["invalid_json", "unknown_type", "invalid", "spoofed", "unapplicable"]
KINDS: tuple[Kind, ...] = get_args(Kind)
"""invalid_json: not JSON; unknown_type: no or an unknown `type`; invalid: fails its event model; spoofed:
the envelope names another node than its subject; unapplicable: a valid event the core raised on."""


class SubjectMismatch(ValueError):
    """An event whose envelope names another node (or cluster, or type) than the subject it was published on.

    NATS permissions fence an agent to its own node's subjects, so the subject is what is believed: an agent
    whose login is stolen must not pose as another node by writing another `source`."""


_TYPE_ERRORS = frozenset({"union_tag_invalid", "union_tag_not_found", "model_type", "dict_type"})


def error_kind(err: Exception) -> Kind:
    """Which of `KINDS` the error is (never a string taken from the event)."""
    if isinstance(err, SubjectMismatch):
        return "spoofed"
    if isinstance(err, ValidationError):
        types = {e["type"] for e in err.errors()}
        if "json_invalid" in types or "json_type" in types:
            return "invalid_json"
        return "unknown_type" if types and types <= _TYPE_ERRORS else "invalid"
    return "unapplicable"


def _reason(err: Exception) -> str:
    """One line saying what was wrong (the first problem of a ValidationError, with its location)."""
    if isinstance(err, ValidationError) and err.errors():
        first = err.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ()))
        return f"{loc}: {first['msg']}" if loc else str(first["msg"])
    text = str(err)
    return text.splitlines()[0] if text else type(err).__name__


@dataclass
class _KindLog:
    count: int = 0
    unlogged: int = 0
    logged_at: float = 0.0
    last: str = ""


class DeadLetters:
    def __init__(self, bus: Bus, metrics: EngineMetrics, *, summary_every: float = 60.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.bus = bus
        self.metrics = metrics
        self.summary_every = summary_every
        self._monotonic = monotonic
        self._logs: dict[Kind, _KindLog] = {}

    @property
    def seen(self) -> dict[str, int]:
        """Malformed events so far, by kind."""
        return {k: v.count for k, v in self._logs.items()}

    def _log(self, kind: Kind, subject: str, reason: str) -> None:
        entry = self._logs.setdefault(kind, _KindLog())
        entry.count += 1
        entry.last = f"on {subject[:200]}: {reason[:300]}"
        now = self._monotonic()
        if entry.count == 1:
            entry.logged_at = now
            log.warning("malformed event (%s) sent to the dead-letter queue %s; more of this kind are "
                        "summed up at most every %gs", kind, entry.last, self.summary_every)
            return
        entry.unlogged += 1
        if now - entry.logged_at >= self.summary_every:
            log.warning("%d more malformed events (%s) sent to the dead-letter queue in the last %.0fs; the "
                        "latest %s", entry.unlogged, kind, now - entry.logged_at, entry.last)
            entry.unlogged, entry.logged_at = 0, now

    async def send(self, subject: str, data: bytes, err: Exception, msg_id: str | None = None) -> None:
        """Store the message in GPUEVENTS_DLQ; raises BusError if it could not be stored."""
        kind = error_kind(err)
        reason = _reason(err)
        self.metrics.malformed.labels(kind=kind).inc()
        self._log(kind, subject, reason)
        headers_id = f"dlq-{msg_id}" if msg_id else None
        try:
            await self.bus.js_publish(
                S.dlq_subject(subject), data, msg_id=headers_id,
                headers={"Gpuevents-Error": f"{kind}: {reason[:500]}", "Gpuevents-Subject": subject},
            )
        except BusError:
            log.error("could not store a malformed event from %s in the dead-letter queue", subject[:200])
            raise
