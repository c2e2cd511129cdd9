"""What the engine believes of a delivery: decoded once, its node the one in its subject, its times on the server's
clock. Anything it cannot believe goes to the dead-letter queue, counted, and is never applied."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

from pydantic import ValidationError

from gpuevents import subjects as S
from gpuevents.bus import Delivery
from gpuevents.events import SCHEDULER_SOURCE, DemandEvent, Event, JobEndedEvent
from rules.engine.claims import NodeClaims
from rules.engine.deadletter import SubjectMismatch
from rules.engine.metrics import EngineMetrics
from rules.intake.decoder import RepeatDecoder
from rules.intake.skew import SkewGuard

log = logging.getLogger(__name__)
_stored_subject = functools.lru_cache(maxsize=1 << 16)(S.stored_event_subject)


class Acceptor:
    """`accept(delivery)`: the event to apply, or None once it has been dead-lettered."""

    def __init__(self, max_clock_skew: float, metrics: EngineMetrics, partition: int | None,
                 dead_letter: Callable[[Delivery, Exception], Awaitable[None]]) -> None:
        self.decoder = RepeatDecoder()
        self.skew = SkewGuard(max_clock_skew)
        self.metrics = metrics
        self.partition = partition
        self._dead_letter = dead_letter
        self.claims = NodeClaims()

    async def accept(self, d: Delivery) -> Event | None:
        got = self.check(d)
        if isinstance(got, Exception):
            await self._dead_letter(d, got)
            return None
        return got

    def check(self, d: Delivery) -> Event | Exception:
        """The event to apply, or why it is not believed (for the caller to dead-letter)."""
        try:
            event = self.decoder.decode(d.data)
        except ValidationError as e:
            return e
        if d.subject != _stored_subject(event.cluster, event.node, event.type, self.partition):
            # NATS permissions fence an agent to its node's subjects: the subject is what is believed.
            return SubjectMismatch(
                f"the envelope says {event.type} from {event.source} in cluster {event.cluster}; the subject "
                f"{d.subject} says otherwise")
        if isinstance(event, DemandEvent | JobEndedEvent) and event.node != SCHEDULER_SOURCE:
            # demand steers reclaiming, a job's end mails its user: only the engine's own subject for them (no
            # agent may publish there) says so
            return SubjectMismatch(f"{event.type} from {event.source}: believed only from node/{SCHEDULER_SOURCE}")
        self.decoder.accepted(event)  # only now: a rejected event never takes a place in the decoder's cache
        checked = self.skew.check(event, d.time)
        if checked is not event:
            self.metrics.clock_skew.inc()
        conflict = self.claims.see(checked, d.time or checked.time)
        if conflict is not None:
            log.warning("%s", conflict.text())
            self.metrics.node_claim_conflicts.labels(node=conflict.node).inc()
        return checked
