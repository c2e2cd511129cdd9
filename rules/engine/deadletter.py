"""Malformed events: to `gpuevents.dlq.>` with the reason, counted, logged once per kind."""

from __future__ import annotations

import logging

from pydantic import ValidationError

from gpuevents import subjects as S
from gpuevents.bus import Bus, BusError
from rules.engine.metrics import EngineMetrics

log = logging.getLogger(__name__)


class SubjectMismatch(ValueError):
    """An event whose envelope names another node (or cluster, or type) than the subject it was published on.

    NATS permissions fence an agent to its own node's subjects, so the subject is what is believed: an agent
    whose login is stolen must not pose as another node by writing another `source`."""


def error_kind(err: Exception) -> str:
    """A short, stable name for what was wrong, for counting and for logging once."""
    if isinstance(err, ValidationError):
        first = err.errors()[0] if err.errors() else {"type": "invalid", "loc": ()}
        loc = ".".join(str(x) for x in first.get("loc", ()) if not isinstance(x, int))
        return f"{first['type']}:{loc}" if loc else str(first["type"])
    return type(err).__name__


class DeadLetters:
    def __init__(self, bus: Bus, metrics: EngineMetrics) -> None:
        self.bus = bus
        self.metrics = metrics
        self.seen: dict[str, int] = {}

    async def send(self, subject: str, data: bytes, err: Exception, msg_id: str | None = None) -> None:
        """Store the message in GPUEVENTS_DLQ; raises BusError if it could not be stored."""
        kind = error_kind(err)
        self.metrics.malformed.labels(kind=kind).inc()
        count = self.seen.get(kind, 0) + 1
        self.seen[kind] = count
        if count == 1:
            log.warning("malformed event on %s sent to the dead-letter queue (%s): %s",
                        subject, kind, str(err).splitlines()[0][:300])
        headers_id = f"dlq-{msg_id}" if msg_id else None
        try:
            await self.bus.js_publish(
                S.dlq_subject(subject), data, msg_id=headers_id,
                headers={"Gpuevents-Error": f"{kind}: {str(err).splitlines()[0][:500]}",
                         "Gpuevents-Subject": subject},
            )
        except BusError:
            log.error("could not store a malformed event from %s in the dead-letter queue", subject)
            raise
