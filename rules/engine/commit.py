"""Committing a step's result: action requests and audit records to the streams, incidents and snoozes to KV.

Every part of a commit is safe to repeat (requests and audit messages carry message ids, incident writes
overwrite), so a commit the bus did not take is retried until it does: a NATS blip is ridden out, not a
reason to stop the engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpuevents.aio import Backoff
from gpuevents.bus import Bus, BusError, BusStoreFull, Kv, PublishItem
from gpuevents.clock import Clock
from gpuevents.records import ActionRequest, AuditRecord, action_message
from rules.core.core import Snooze, StepResult
from rules.core.incidents import Incident, Transition
from rules.core.limits import LimitWindows
from rules.engine.audit import audit_items, transition_record
from rules.engine.metrics import EngineMetrics
from rules.engine.sites import held_for_site
from rules.engine.store import ModelStore, PipelinedStore, incident_key, limits_key, snooze_key

log = logging.getLogger(__name__)

RETRY_BASE_S = 0.1
RETRY_MAX_S = 5.0


@dataclass(frozen=True)
class EngineStores:
    """Where the engine keeps its state in the KV bucket: incidents, snoozes and rate-limit windows."""

    incidents: ModelStore[Incident]
    snoozes: ModelStore[Snooze]
    limits: ModelStore[LimitWindows]

    @classmethod
    def in_bucket(cls, kv: Kv) -> EngineStores:
        return cls(PipelinedStore(kv, "incident.", Incident), PipelinedStore(kv, "snooze.", Snooze),
                   PipelinedStore(kv, "limits.", LimitWindows))


class Committer:
    """Writes step results to the bus and the engine's stores, built with all it needs once the engine has its
    KV bucket. `partition`: the fleet partition the engine acts for (None: the whole fleet); once `stopping` is
    set, a failing commit raises instead of retrying."""

    def __init__(self, bus: Bus, clock: Clock, metrics: EngineMetrics, describe: Callable[[str], str],
                 stores: EngineStores, *, partition: int | None, stopping: asyncio.Event) -> None:
        self.bus = bus
        self.clock = clock
        self.metrics = metrics
        self.describe = describe  # rule name -> its description, for the FIRING log line
        self.stores = stores
        self.partition = partition
        self.stopping = stopping
        self.degraded: str | None = None  # why, while JetStream refuses the engine's writes for lack of room

    async def retry(self, op: Callable[[], Awaitable[None]], what: str) -> None:
        """Run `op` until the bus takes it; gives up, raising, only once the engine is stopping. While JetStream
        has no room the engine is degraded (status, metrics, one error line) until a write goes through."""
        backoff = Backoff(RETRY_BASE_S, RETRY_MAX_S, jitter=False)
        while True:
            try:
                await op()
                if self.degraded is not None:
                    log.warning("JetStream stores the engine's writes again: no longer degraded")
                    self.degraded = None
                    self.metrics.degraded.set(0)
                return
            except BusError as e:
                if self.stopping.is_set():
                    raise
                self.metrics.bus_retries.inc()
                delay = backoff.next()
                if isinstance(e, BusStoreFull):
                    self.metrics.store_full.inc()
                    if self.degraded is None:
                        log.error("DEGRADED: JetStream has no room for the engine's writes (%s); the engine keeps "
                                  "running and retries: free space or raise the limits (docs/deploy.md)", e)
                    self.degraded = f"JetStream has no room: {e}"
                    self.metrics.degraded.set(1)
                log.warning("could not %s (%s); retrying in %.1fs", what, e, delay)
                await asyncio.sleep(delay)

    async def commit(self, result: StepResult, what: str) -> None:
        """Send the step's action requests and audit records (pipelined: one wait for all their acks), then
        write its incidents and snoozes. The messages are built once, so a retry sends the very same ones and
        JetStream stores each once. Requests and audit are stored before the incidents are written."""
        if not (result.actions or result.transitions or result.incidents or result.snoozes or result.errors
                or result.limits is not None):
            return
        now = self.clock.now()
        for t in result.transitions:
            self._explain(t)
        for p in result.errors:
            self.metrics.eval_errors.labels(rule=p.rule).inc()
            log.warning("rule %s: condition failed on %s (counted as false; reported once): %s",
                        p.rule, p.entity_id, p.message)
        # a site cut off from the hub: no remedy on its readings, which may be stale (held, audited as such)
        cut = self.bus.sites_cut_off
        if cut:
            result.actions = [held_for_site(r, cut.get(r.cluster), now) for r in result.actions]
        items = [PublishItem(*action_message(r)) for r in result.actions]
        items += audit_items(map(transition_record, result.transitions))
        incidents: dict[str, Incident | None] = {}
        for inc in result.incidents:
            incidents[incident_key(inc.rule, inc.entity_key)] = inc if inc.open else None
        snoozes: dict[str, Snooze | None] = {}
        for s in result.snoozes:
            snoozes[snooze_key(s.rule, s.entity_id)] = s if s.until > now else None
        incident_store, snooze_store, limit_store = self.stores.incidents, self.stores.snoozes, self.stores.limits
        limits: list[tuple[str, LimitWindows | None]] = (
            [(limits_key(self.partition), result.limits)] if result.limits is not None else [])

        async def write() -> None:
            if items:
                raise_first(await self.bus.js_publish_many(items))
            await incident_store.save_many(list(incidents.items()))
            await snooze_store.save_many(list(snoozes.items()))
            await limit_store.save_many(limits)

        await self.retry(write, what)
        dispatched = self.clock.now()
        for request in result.actions:
            self._dispatched(request, dispatched)

    async def audit(self, records: list[AuditRecord]) -> None:
        if records:
            raise_first(await self.bus.js_publish_many(audit_items(records)))

    def _dispatched(self, request: ActionRequest, now: datetime) -> None:
        self.metrics.actions.labels(type=request.type, outcome=request.decision).inc()
        if request.event_time is not None:
            self.metrics.latency.observe(max(0.0, (now - request.event_time).total_seconds()))
        if request.decision == "run":
            log.debug("%s: %s on %s (%s)%s", request.rule, request.type, request.entity_id,
                      request.phase, " [dry run]" if request.dry_run else "")
        else:
            log.info("%s: %s on %s %s: %s", request.rule, request.type, request.entity_id,
                     request.decision, request.reason or "")

    def _explain(self, t: Transition) -> None:
        """One line per incident that starts firing or ends, saying which rule and why."""
        if t.to_status == "firing":
            why = self.describe(t.rule)
            log.info("FIRING %s on %s%s", t.rule, t.entity_id, f": {why}" if why else "")
        elif t.to_status == "resolved":
            log.info("resolved %s on %s%s", t.rule, t.entity_id, f" ({t.reason})" if t.reason else "")


def raise_first(results: Sequence[int | BusError]) -> None:
    for r in results:
        if isinstance(r, BusError):
            raise r

