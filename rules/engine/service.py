"""The engine service: the imperative shell around the pure core — consume, step, dispatch, persist, ack."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gc
import logging
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from gpuevents import subjects as S
from gpuevents.bus import Bus, BusError, Consumer, Delivery, KvExists, KvWrongRevision, PublishItem
from gpuevents.clock import Clock, SystemClock
from gpuevents.config import Config
from gpuevents.events import Event, NodeSnapshot, SnapshotEvent, decode_event
from gpuevents.records import ActionRequest, AuditRecord, action_message, audit_messages, decode_audit
from gpuevents.yamlpos import LocatedError
from rules.core.core import Core, Snooze, StepResult, Sweep, Tick
from rules.core.incidents import Incident, Transition
from rules.engine.deadletter import DeadLetters
from rules.engine.lease import Lease
from rules.engine.metrics import EngineMetrics
from rules.engine.store import M, ModelStore, incident_key, snooze_key
from rules.lang.loader import load_rule_set, rule_files
from rules.lang.model import RuleSet
from rules.visibility.recorder import UsageRecorder

log = logging.getLogger(__name__)

FETCH_BATCH = 512
SWEEP_SLICE = 2_000  # entities evaluated per step of a tick's sweep: a few milliseconds
FETCH_TIMEOUT_S = 0.5
RELOAD_POLL_S = 1.0
AUDIT_TAIL = 400
AUDIT_TAIL_BYTES = 1 << 20  # the newest audit messages kept for the dashboard (a batch's message holds many)
GC_THRESHOLDS = (700, 10, 100)
"""Python's young-generation thresholds; full collections ten times rarer than its default, since the engine
freezes what survives every second and collects everything hourly itself (see FREEZE_STEP)."""
FREEZE_STEP = 1_000
FREEZE_EVERY_S = 1.0
"""The fleet state is millions of long-lived objects without cycles. Each second (or each time it has grown
by FREEZE_STEP entities and incidents), the young generations are collected and everything alive is frozen
(`gc.freeze`, which costs nothing): the old generation then holds only what came since, and its full
collections stay short. Without that, collections walk the whole state and find nothing: the first round
of the throughput benchmark (2,000 new nodes) spent a third of its time in them, and at a steady load they
stalled the engine for 0.1 - 0.2 s, the longest waits an event had. Frozen objects are still freed by
reference counting when the state drops them; cyclic garbage that was alive at a freeze (none was found in
the benchmark) is collected by the full collection every FULL_GC_EVERY_S, which walks everything (about a
second for 2,000 nodes of 8 GPUs, once an hour)."""
FULL_GC_EVERY_S = 3600.0
_PYTHON_GC_THRESHOLDS = gc.get_threshold()  # as the process had them before any engine ran


_action_subject = functools.lru_cache(maxsize=256)(S.action_subject)


def transition_record(t: Transition) -> AuditRecord:
    # Built from a validated Transition whose fields have the record's types: no second validation.
    return AuditRecord.model_construct(time=t.time, kind="transition", rule=t.rule, entity_id=t.entity_id,
                                       cluster=t.cluster, incident_id=t.incident_id, from_status=t.from_status,
                                       to_status=t.to_status, detail=t.reason or None)


class Engine:
    """One engine replica. Only the replica holding the KV lease consumes and acts."""

    def __init__(self, config: Config, bus: Bus, *, clock: Clock | None = None,
                 rule_paths: Sequence[Path] | None = None, metrics: EngineMetrics | None = None,
                 holder: str | None = None) -> None:
        self.config = config
        self.bus = bus
        self.clock = clock or SystemClock()
        self.rule_paths = list(rule_paths if rule_paths is not None else config.engine.rules)
        self.metrics = metrics or EngineMetrics()
        self.holder = holder
        self.core: Core | None = None
        self.leader = asyncio.Event()
        self.ready = asyncio.Event()
        self._lock = asyncio.Lock()
        self._reload = asyncio.Event()
        self._mtimes: dict[Path, float] = {}
        self._incidents: ModelStore[Incident] | None = None
        self._snoozes: ModelStore[Snooze] | None = None
        self._consumer: Consumer | None = None
        self._subs: list[Any] = []
        self.dead_letters = DeadLetters(bus, self.metrics)
        self.decoder = RepeatDecoder()
        self._inflight: asyncio.Task[None] | None = None
        self._stopping = False  # the last batch's commit and acks
        self._audit_raw: collections.deque[bytes] = collections.deque()
        self._audit_bytes = 0
        self.usage: UsageRecorder | None = None
        self.lease_checks = 0
        self.release_lease_on_stop = True  # tests turn it off to play a crashed engine
        self._frozen_size = 0
        self._next_freeze = 0.0
        self._full_gc_at = 0.0

    # ------------------------------------------------------------ rules
    def load_rules(self) -> RuleSet:
        """The rule set from `rule_paths`; LocatedError with every problem otherwise."""
        rules = load_rule_set(self.rule_paths, default_timezone=self.config.engine.timezone)
        self._mtimes = self._current_mtimes()
        return rules

    def _current_mtimes(self) -> dict[Path, float]:
        files, _ = rule_files(self.rule_paths)
        out = {}
        for f in files:
            with contextlib.suppress(OSError):
                out[f] = f.stat().st_mtime
        return out

    async def reload(self) -> bool:
        """Load the rules again; on error keep the running set and log every `file:line`."""
        try:
            rules = load_rule_set(self.rule_paths, default_timezone=self.config.engine.timezone)
        except LocatedError as e:
            self._mtimes = self._current_mtimes()
            self.metrics.reloads.labels(result="failed").inc()
            log.error("rule reload failed; the previous %d rules keep running:\n%s",
                      len(self.core.rules) if self.core else 0, e)
            return False
        self._mtimes = self._current_mtimes()
        async with self._lock:
            await self._settle()
            assert self.core is not None
            # Incidents of changed or removed rules close through the normal path: audited, on_resolve run.
            closed = self.core.replace_rules(rules, self.clock.now())
            if self._incidents is not None:
                await self._commit(closed, "commit the incidents a reload closed")
        self.metrics.reloads.labels(result="ok").inc()
        log.info("rules reloaded: %d rules (%d incidents of changed or removed rules closed)", len(rules),
                 len(closed.incidents))
        await self._audit([AuditRecord(time=self.clock.now(), kind="reload",
                                       detail=f"{len(rules)} rules loaded")])
        return True

    # ------------------------------------------------------------ run
    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set: hold or wait for the lease, then consume, tick and act."""
        rules = self.load_rules()
        self.core = Core(rules, self.config)
        gc.freeze()  # what is loaded by now lives as long as the process: keep it out of collections
        gc.set_threshold(*GC_THRESHOLDS)
        self._frozen_size = 0
        self._full_gc_at = time.monotonic() + FULL_GC_EVERY_S
        self.usage = UsageRecorder.from_config(self.config)
        kv = await self.bus.kv()
        self._incidents = PipelinedStore(kv, "incident.", Incident)
        self._snoozes = PipelinedStore(kv, "snooze.", Snooze)
        lease = Lease(kv, self.clock, self.config.engine.lease_ttl, holder=self.holder)
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, self._reload.set)
        log.info("engine %s: %d rules from %s", lease.holder, len(rules),
                 ", ".join(map(str, self.rule_paths)) or "(none)")
        tasks = [
            asyncio.create_task(self._lease_loop(lease, stop), name="lease"),
            asyncio.create_task(self._consume_loop(stop), name="consume"),
            asyncio.create_task(self._tick_loop(stop), name="tick"),
            asyncio.create_task(self._reload_loop(stop), name="reload"),
        ]
        try:
            done, _ = await asyncio.wait([*tasks, asyncio.create_task(stop.wait())],
                                         return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t in tasks and not t.cancelled() and t.exception() is not None:
                    log.error("engine task %s finished unexpectedly", t.get_name(),
                              exc_info=t.exception())
                    raise t.exception()  # type: ignore[misc]
        finally:
            # Let the consumer finish its fetch and batch (it checks `stop` between fetches): a
            # pull request cancelled mid-way leaves its messages unacknowledged until ack_wait.
            consume = tasks[1]
            if stop.is_set() and not consume.done():
                await asyncio.wait([consume], timeout=FETCH_TIMEOUT_S * 2 + 10)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._stopping = True
            try:
                await self._settle()  # the last batch's commit and acks
            except (BusError, asyncio.CancelledError) as e:
                log.warning("the last batch was not committed (it will be redelivered): %r", e)
            await self._step_down()
            if self.release_lease_on_stop:
                await lease.release()
            if self.usage is not None:
                await self._flush_usage()
                self.usage.close()
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGHUP)
            gc.set_threshold(*_PYTHON_GC_THRESHOLDS)
            gc.unfreeze()  # what this engine froze is collectable again once it is gone

    async def _lease_loop(self, lease: Lease, stop: asyncio.Event) -> None:
        period = max(0.05, self.config.engine.lease_ttl / 3)
        while not stop.is_set():
            try:
                held = await lease.tick()
            except BusError as e:
                log.warning("lease renewal failed: %s", e)
                held = lease.held
            self.lease_checks += 1
            if held and not self.leader.is_set():
                await self._take_over()
            elif not held and self.leader.is_set():
                log.warning("lease lost: this engine stops acting")
                await self._step_down()
            self.metrics.leader.set(1 if self.leader.is_set() else 0)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), period)

    async def _take_over(self) -> None:
        """Become the acting engine: restore incidents and snoozes from KV, then consume."""
        assert self.core is not None and self._incidents is not None and self._snoozes is not None
        async with self._lock:
            incidents = list((await self._incidents.load()).values())
            snoozes = list((await self._snoozes.load()).values())
            self.core = Core(self.core.rules, self.config)
            self.core.restore(incidents, snoozes, now=self.clock.now())
            self._consumer = await self.bus.consumer(
                S.STREAM_EVENTS, self.config.engine.consumer, S.EVENTS_ALL,
                ack_wait=60, max_ack_pending=50_000, prefetch=True)
            self._subs = [
                await self.bus.serve(S.ENGINE_STATUS, self._serve_status),
                await self.bus.serve(S.ENGINE_SNOOZE, self._serve_snooze),
                await self.bus.subscribe(S.AUDIT_ALL, self._on_audit),
            ]
        log.info("this engine is acting: %d open incidents and %d snoozes restored",
                 len(incidents), len(snoozes))
        self.leader.set()
        self.ready.set()

    async def _step_down(self) -> None:
        self.leader.clear()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs = []
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.close()

    async def _consume_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if not self.leader.is_set() or self._consumer is None:
                await _wait_any(stop, self.leader, timeout=1.0)
                continue
            consumer = self._consumer
            deliveries = await consumer.fetch(FETCH_BATCH, timeout=FETCH_TIMEOUT_S)
            if not deliveries:
                continue
            if self.leader.is_set():
                await self.handle(deliveries)
            else:  # the lease went while fetching: give them back for the next leader
                for d in deliveries:
                    await d.nak()

    async def handle(self, deliveries: list[Delivery]) -> None:
        """Step the core through a batch of deliveries; then, once the previous batch is committed, start this
        one's commit (dispatch, audit, persist) and acks in the background. The next batch is thus stepped
        while this one's acks are on their way; commits stay in order, one in flight at most, and a failed
        one is raised by the next `handle` or `settle`."""
        async with self._lock:
            assert self.core is not None
            total = StepResult()
            counts: Counter[str] = Counter()
            for d in deliveries:
                try:
                    event = self.decoder.decode(d.data)
                except ValidationError as e:
                    await self._dead_letter(d, e)
                    continue
                counts[event.type] += 1
                now = self.clock.now()
                try:
                    total.extend(self.core.step(event, now))
                except Exception as e:
                    # A schema-valid event the core cannot digest must not stop the fleet's watch, nor
                    # come back forever: it is dead-lettered like a malformed one, with the reason.
                    log.exception("event %s from %s could not be applied", event.type, d.subject)
                    await self._dead_letter(d, e)
                    continue
                if self.usage is not None and isinstance(event, SnapshotEvent):
                    # A repeated snapshot is counted from the equal one already held (the usage figures
                    # read none of the fields that may differ), so the new copy dies young.
                    snap = self.core.state.current_snapshot(event)
                    self.usage.observe(event if snap is event.data else event.model_copy(update={"data": snap}),
                                       now)
            for type_, n in counts.items():
                self.metrics.events.labels(type=type_).inc(n)
            await self._settle()
            self._inflight = asyncio.create_task(self._commit_and_ack(total, deliveries), name="commit")
        self._freeze()

    async def _commit_and_ack(self, result: StepResult, deliveries: list[Delivery]) -> None:
        await self._commit(result, "commit the batch's actions, audit and incidents")
        for d in deliveries:
            await d.ack()

    async def _dead_letter(self, d: Delivery, err: Exception) -> None:
        await self._retry_bus(lambda: self.dead_letters.send(d.subject, d.data, err, d.headers.get("Nats-Msg-Id")),
                              "store a malformed event in the dead-letter queue")

    async def _retry_bus(self, op: Callable[[], Awaitable[None]], what: str) -> None:
        """Run `op` until the bus takes it: a NATS blip is ridden out, not a reason to stop the engine.

        Every step of a commit is safe to repeat (requests and audit records carry message ids, incident
        writes overwrite). Gives up, raising, only once the engine is stopping."""
        delay = 0.1
        while True:
            try:
                await op()
                return
            except BusError as e:
                if self._stopping:
                    raise
                self.metrics.bus_retries.inc()
                log.warning("could not %s (%s); retrying in %.1fs", what, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def settle(self) -> None:
        """Wait until the batch in flight is committed and acknowledged (raises what its commit raised)."""
        async with self._lock:
            await self._settle()

    async def _settle(self) -> None:
        task, self._inflight = self._inflight, None
        if task is not None:
            await task

    def _freeze(self) -> None:
        """Collect the young generations and freeze what is alive (see FREEZE_STEP), at most every
        FREEZE_EVERY_S or when the state has grown by FREEZE_STEP; a full collection every FULL_GC_EVERY_S."""
        core = self.core
        if core is None:
            return
        now = time.monotonic()
        size = sum(map(len, core.state.by_kind.values())) + sum(map(len, core.incidents.values()))
        self._frozen_size = min(self._frozen_size, size)  # it shrank: count growth from here
        if now < self._next_freeze and size < self._frozen_size + FREEZE_STEP:
            return
        if now >= self._full_gc_at:
            self._full_gc_at = now + FULL_GC_EVERY_S
            gc.unfreeze()
            found = gc.collect()
            log.info("hourly full garbage collection: %.2f s, %d unreachable objects",
                     time.monotonic() - now, found)
        else:
            gc.collect(1)
        gc.freeze()
        self._frozen_size = size
        self._next_freeze = now + FREEZE_EVERY_S

    async def _tick_loop(self, stop: asyncio.Event) -> None:
        tick = float(self.config.engine.tick)
        while not stop.is_set():
            if not self.leader.is_set() or self.core is None:
                await _wait_any(stop, self.leader, timeout=1.0)
                continue
            now = self.clock.now()
            wake = min(self.core.next_wakeup(now).timestamp() - now.timestamp(), tick)
            if wake > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), wake)
                if stop.is_set() or not self.leader.is_set():
                    continue
            await self.tick()

    async def tick(self, now: datetime | None = None) -> StepResult:
        """Step the core through a tick; the periodic sweep of time-dependent rules runs SWEEP_SLICE entities at
        a time, letting the events that arrive meanwhile in between (a slice is evaluated at its own time)."""
        async with self._lock:
            await self._settle()
            assert self.core is not None
            result = self.core.step(Tick(sweep=False), now or self.clock.now())
            await self._commit(result, "commit a tick")
        core = self.core
        for name in result.sweeps:
            rule = core.rules.by_name.get(name)
            if rule is None:
                continue
            keys = list(core.state.by_kind[rule.kind])
            for i in range(0, len(keys), SWEEP_SLICE):
                await asyncio.sleep(0)  # events first
                async with self._lock:
                    if not self.leader.is_set() or self.core is not core:
                        return result  # the lease went, or another core took over: its own ticks sweep
                    await self._settle()
                    part = core.step(Sweep(rule=name, rule_hash=rule.hash, keys=tuple(keys[i:i + SWEEP_SLICE])),
                                     now or self.clock.now())
                    await self._commit(part, "commit a sweep")
                result.extend(part)
        self._update_gauges()
        await self._flush_usage()
        self._freeze()
        return result

    async def _flush_usage(self) -> None:
        """Write the usage rollups counted so far; count the waste they add to the metrics."""
        if self.usage is None:
            return
        try:
            delta = await self.usage.flush(self.clock.now())
        except Exception:
            log.exception("usage rollups could not be written; they are kept for the next tick")
            return
        self.metrics.waste.labels(kind="held_idle").inc(delta.held_idle)
        self.metrics.waste.labels(kind="unallocated").inc(delta.unallocated)

    async def _reload_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._reload.wait(), RELOAD_POLL_S)
            if stop.is_set():
                return
            if self._reload.is_set() or self._current_mtimes() != self._mtimes:
                self._reload.clear()
                try:
                    await self.reload()
                except Exception:
                    # LocatedError is handled inside; anything else is a bug, and still no reason to stop
                    # watching the fleet with the rules that run.
                    self._mtimes = self._current_mtimes()
                    self.metrics.reloads.labels(result="failed").inc()
                    log.exception("rule reload failed; the previous rules keep running")

    # ------------------------------------------------------------ dispatch and persist
    async def _commit(self, result: StepResult, what: str) -> None:
        """Send the step's action requests and audit records (pipelined: one wait for all their acks), then write
        its incidents and snoozes; retried until the bus takes all of it (`_retry_bus`).

        The messages are built once, so a retry sends the very same ones and JetStream stores each once
        (requests carry their key, audit messages their first record's id). Requests and audit are stored
        before the incidents are written."""
        if not (result.actions or result.transitions or result.incidents or result.snoozes
                or result.errors):
            return
        now = self.clock.now()
        for t in result.transitions:
            self._explain(t)
        for p in result.errors:
            self.metrics.eval_errors.labels(rule=p.rule).inc()
            log.warning("rule %s: condition failed on %s (counted as false; reported once): %s",
                        p.rule, p.entity_id, p.message)
        items = [PublishItem(*action_message(r)) for r in result.actions]
        items += _audit_items(map(transition_record, result.transitions))
        incidents: dict[str, Incident | None] = {}
        for inc in result.incidents:
            incidents[incident_key(inc.rule, inc.entity_key)] = inc if inc.open else None
        snoozes: dict[str, Snooze | None] = {}
        for s in result.snoozes:
            snoozes[snooze_key(s.rule, s.entity_id)] = s if s.until > now else None
        assert self._incidents is not None and self._snoozes is not None
        incident_store, snooze_store = self._incidents, self._snoozes

        async def write() -> None:
            if items:
                _raise_first(await self.bus.js_publish_many(items))
            await incident_store.save_many(list(incidents.items()))
            await snooze_store.save_many(list(snoozes.items()))

        await self._retry_bus(write, what)
        dispatched = self.clock.now()
        for request in result.actions:
            self._dispatched(request, dispatched)

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
        if t.to_status not in ("firing", "resolved"):
            return
        rule = self.core.rules.by_name.get(t.rule) if self.core else None
        why = rule.spec.description if rule is not None and rule.spec.description else ""
        if t.to_status == "firing":
            log.info("FIRING %s on %s%s", t.rule, t.entity_id, f": {why}" if why else "")
        else:
            log.info("resolved %s on %s%s", t.rule, t.entity_id, f" ({t.reason})" if t.reason else "")

    async def _audit(self, records: list[AuditRecord]) -> None:
        if records:
            _raise_first(await self.bus.js_publish_many(_audit_items(records)))

    async def _on_audit(self, msg: Any) -> None:
        """Keep the newest audit messages (ours and the runners') for the dashboard, parsed when it asks."""
        self._audit_raw.append(msg.data)
        self._audit_bytes += len(msg.data)
        while self._audit_bytes > AUDIT_TAIL_BYTES and len(self._audit_raw) > 1:
            self._audit_bytes -= len(self._audit_raw.popleft())

    @property
    def audit_tail(self) -> list[AuditRecord]:
        """The newest AUDIT_TAIL audit records, oldest first (unreadable ones left out)."""
        newest: list[list[AuditRecord]] = []
        n = 0
        for raw in reversed(self._audit_raw):
            records = decode_audit(raw)
            newest.append(records)
            n += len(records)
            if n >= AUDIT_TAIL:
                break
        tail = [r for records in reversed(newest) for r in records]
        tail.sort(key=lambda r: r.time)  # a batch's records are grouped by rule in the stream
        return tail[-AUDIT_TAIL:]

    def _update_gauges(self) -> None:
        core = self.core
        if core is None:
            return
        counts = {"pending": 0, "firing": 0}
        for inc in core.open_incidents():
            counts[inc.status] = counts.get(inc.status, 0) + 1
        for state, n in counts.items():
            self.metrics.incidents.labels(state=state).set(n)
        gpus = core.gpus()
        self.metrics.gpus.set(len(gpus))
        self.metrics.held_idle.set(sum(1 for g in gpus if g.idle and g.processes))
        self.metrics.nodes_online.set(sum(1 for n in core.nodes() if n.online))

    # ------------------------------------------------------------ status and snooze
    def status(self) -> dict[str, Any]:
        """The fleet and open incidents, as `gpuevents status` shows them."""
        from rules.engine.status import fleet_status

        assert self.core is not None
        return fleet_status(self.core, self.clock.now()).model_dump(mode="json")

    async def _serve_status(self, payload: bytes, subject: str) -> bytes:
        async with self._lock:
            await self._settle()
            return orjson.dumps(self.status())

    async def _serve_snooze(self, payload: bytes, subject: str) -> bytes:
        try:
            s = Snooze.model_validate_json(payload)
        except ValidationError as e:
            return orjson.dumps({"ok": False, "error": str(e)})
        return orjson.dumps(await self.snooze(s))

    async def snooze(self, s: Snooze) -> dict[str, Any]:
        async with self._lock:
            await self._settle()
            assert self.core is not None
            if s.rule not in self.core.rules.by_name:
                return {"ok": False, "error": f"no rule named {s.rule!r}"}
            result = self.core.step(s, self.clock.now())
            await self._commit(result, "commit a snooze")
        await self._audit([AuditRecord(time=self.clock.now(), kind="snooze", rule=s.rule,
                                       entity_id=s.entity_id,
                                       detail=f"until {s.until.isoformat()} by {s.by or '?'}"
                                       + (f": {s.reason}" if s.reason else ""))])
        return {"ok": True, "until": s.until.isoformat()}


class RepeatDecoder:
    """`decode_event` that validates a snapshot's `data` once while a node repeats it byte for byte.

    An event's JSON is its envelope and, last, `"data":{...}`. When a node's snapshot carries the very bytes
    of `data` that the previous one did (already validated into a NodeSnapshot), only the envelope is parsed
    and validated, and the NodeSnapshot is reused; the event is the one `decode_event` would give. Anything
    else (another shape, another type, different bytes, any error on the way) takes `decode_event`, so a
    malformed event raises the same ValidationError."""

    MAX_NODES = 200_000

    def __init__(self) -> None:
        self._last: dict[str, tuple[bytes, NodeSnapshot]] = {}

    def decode(self, raw: bytes) -> Event:
        i = raw.find(b',"data":')
        if i > 0 and raw[-1:] == b"}":
            repeated = self._repeat(raw, i)
            if repeated is not None:
                return repeated
            segment = raw[i + 8:-1]
        else:
            segment = b""
        event = decode_event(raw)
        if segment and isinstance(event, SnapshotEvent):
            if len(self._last) >= self.MAX_NODES:
                self._last.clear()
            self._last[event.source] = (segment, event.data)
        return event

    def _repeat(self, raw: bytes, i: int) -> SnapshotEvent | None:
        try:
            envelope = orjson.loads(raw[:i] + b"}")
        except orjson.JSONDecodeError:
            return None
        if type(envelope) is not dict or envelope.get("type") != "node.snapshot":
            return None
        source = envelope.get("source")
        last = self._last.get(source) if type(source) is str else None
        if last is None or last[0] != raw[i + 8:-1]:
            return None
        envelope["data"] = last[1]
        try:
            return SnapshotEvent.model_validate(envelope)
        except ValidationError:
            return None  # let decode_event say what is wrong


def _audit_items(records: Iterable[AuditRecord]) -> list[PublishItem]:
    return [PublishItem(m.subject, m.payload, msg_id=m.msg_id) for m in audit_messages(records)]


def _raise_first(results: Sequence[int | BusError]) -> None:
    for r in results:
        if isinstance(r, BusError):
            raise r


class PipelinedStore(ModelStore[M]):
    """A ModelStore whose `save_many` pipelines the writes (one wait for all their acks); a write that finds
    the key changed under it (another leader's last write) takes `save`'s path: read it, write over it."""

    async def save_many(self, items: list[tuple[str, M | None]]) -> None:
        if not items:
            return
        writes: list[tuple[str, bytes | None, int | None]] = []
        for key, record in items:
            if record is None:
                self._revisions.pop(key, None)
                writes.append((key, None, None))
            else:
                writes.append((key, record.model_dump_json().encode(), self._revisions.get(key)))
        results = await self.kv.write_many(writes)
        retry: list[tuple[str, M | None]] = []
        for (key, record), r in zip(items, results, strict=True):
            if isinstance(r, int):
                if record is not None:
                    self._revisions[key] = r
            elif isinstance(r, KvExists | KvWrongRevision) and record is not None:
                retry.append((key, record))
            else:
                raise r
        if retry:
            await super().save_many(retry)


async def _wait_any(stop: asyncio.Event, other: asyncio.Event, timeout: float) -> None:
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(other.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
