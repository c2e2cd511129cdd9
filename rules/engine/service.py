"""The engine service: the imperative shell around the pure core — hold the lease, consume, step, commit, ack."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Self

from gpuevents import subjects as S
from gpuevents.aio import guarded_task, sleep_or_stop, stop_tasks, until_stop_or_end, wait_any
from gpuevents.bus import Bus, BusError, Consumer, Delivery, Message, Subscription
from gpuevents.clock import Clock, ManualClock, SystemClock
from gpuevents.config import Config
from gpuevents.events import Event, SnapshotEvent
from gpuevents.records import AuditRecord
from gpuevents.yamlpos import LocatedError
from rules.core.core import Core, StepResult, Sweep, Tick
from rules.engine.acceptor import Acceptor
from rules.engine.answers import EngineAnswers
from rules.engine.audit import AuditTail, reload_record
from rules.engine.commit import Committer, EngineStores
from rules.engine.deadletter import DeadLetters
from rules.engine.demand import readers_from_config, run_reader
from rules.engine.gcpolicy import GcPolicy
from rules.engine.hold import CoreHold
from rules.engine.metrics import EngineMetrics
from rules.engine.outcomes import awaiting_since, learn, replayed_outcomes, warning_outcomes
from rules.engine.partitions.lease import Lease, lease_key
from rules.engine.partitions.sharing import exchange
from rules.engine.planner import TickPlanner
from rules.engine.rulefiles import RuleFiles
from rules.engine.servers import serve_requests
from rules.engine.store import limits_key
from rules.usage.jobstore import ended_event
from rules.usage.recorder import UsageRecorder

log = logging.getLogger(__name__)

FETCH_BATCH = 512
SWEEP_SLICE = 2_000  # entities evaluated per step of a tick's sweep: a few milliseconds
FETCH_TIMEOUT_S = 0.5
RELOAD_POLL_S = 1.0
LAST_BATCH_WAIT_S = FETCH_TIMEOUT_S * 2 + 10  # how long a stopping engine lets its last fetch and batch finish


class Engine:
    """One engine replica. Only the replica holding the KV lease consumes and acts. `Engine.open` builds one whole:
    its rules loaded, its core, committer, lease and usage recorder on the bus's KV bucket and the usage database."""

    def __init__(self, config: Config, bus: Bus, clock: Clock, rule_files: RuleFiles, hold: CoreHold,
                 committer: Committer, lease: Lease, usage: UsageRecorder, metrics: EngineMetrics, *,
                 partition: int | None, may_acquire: Callable[[], bool] | None, gc: GcPolicy, shared: bool,
                 stopping: asyncio.Event) -> None:
        self.config = config
        self.bus = bus
        self.clock = clock
        self.rule_files = rule_files
        self.hold = hold
        self.committer = committer
        self.lease = lease
        self.usage = usage
        self.metrics = metrics
        self.partition = partition  # the fleet partition this engine acts for; None: the whole fleet
        self.may_acquire = may_acquire  # asked before taking a lapsed lease (a replica's fair share)
        self._gc = gc
        self._shared = shared  # a replica's engines share the collector policy and usage, which the replica runs
        self._stopping = stopping  # set while the engine stops: a failing commit then raises
        self.leader = asyncio.Event()
        self.ready = asyncio.Event()
        self._reload = asyncio.Event()
        self.planner = TickPlanner(clock, float(config.engine.tick))
        self._consumer: Consumer | None = None  # while acting
        self._subs: list[Subscription] = []
        self.dead_letters = DeadLetters(bus, metrics, monotonic=clock.monotonic)
        self.acceptor = Acceptor(float(config.engine.max_clock_skew), metrics, partition, self._dead_letter)
        self._audit_tail = AuditTail()
        self.answers = EngineAnswers(config, clock, hold, committer, self.acceptor, self.planner, usage, partition)

    @classmethod
    async def open(cls, config: Config, bus: Bus, *, clock: Clock | None = None,
                   rule_paths: Sequence[Path] | None = None, metrics: EngineMetrics | None = None,
                   holder: str | None = None, partition: int | None = None,
                   may_acquire: Callable[[], bool] | None = None, gc: GcPolicy | None = None,
                   usage: UsageRecorder | None = None) -> Self:
        """An engine with its rules loaded (a bad file raises its `file:line`) and its parts open. `gc` and `usage`
        are a replica's, shared by its partitions' engines (given both or neither); otherwise the engine owns its
        own."""
        if (gc is None) != (usage is None):
            raise ValueError("a replica shares both its collector policy and its usage recorder, or neither")
        clock = clock or SystemClock()
        metrics = metrics or EngineMetrics()
        rule_files = RuleFiles(list(rule_paths if rule_paths is not None else config.engine.rules), config)
        hold = CoreHold(Core(rule_files.load(), config))
        kv = await bus.kv()
        stopping = asyncio.Event()
        committer = Committer(bus, clock, metrics, hold.describe, EngineStores.in_bucket(kv), partition=partition,
                              stopping=stopping)
        wall = not isinstance(clock, ManualClock)  # checked against the server's; a virtual clock is not
        lease = Lease(kv, clock, config.engine.lease_ttl, holder=holder, key=lease_key(partition),
                      max_offset=config.engine.max_clock_offset if wall else None)
        shared = usage is not None
        return cls(config, bus, clock, rule_files, hold, committer, lease,
                   usage if usage is not None else UsageRecorder.from_config(config), metrics,
                   partition=partition, may_acquire=may_acquire, gc=gc or GcPolicy(), shared=shared,
                   stopping=stopping)

    @property
    def core(self) -> Core:
        """The core this engine steps now (a take-over replaces it)."""
        return self.hold.core

    def _reads_demand(self) -> bool:
        """One engine reads the schedulers' demand: the leader of the whole fleet, or of partition 0."""
        return self.leader.is_set() and self.partition in (None, 0)

    # ------------------------------------------------------------ rules
    def _owns(self, cluster: str, node: str) -> bool:
        """Whether a node's events come to this engine (always, when the fleet is not partitioned)."""
        if self.partition is None:
            return True
        return S.node_partition(cluster, node, self.config.engine.partitions) == self.partition

    async def reload(self) -> bool:
        """Load the rules again; on error keep the running set and log every `file:line`."""
        try:
            rules = await self.rule_files.reload()  # a child process first: a hostile file costs the child
        except LocatedError as e:
            self.metrics.reloads.labels(result="failed").inc()
            log.error("rule reload failed; the previous %d rules keep running:\n%s", len(self.core.rules), e)
            return False
        async with self.hold.held() as core:
            # Incidents of changed or removed rules close through the normal path: audited, on_resolve run.
            closed = core.replace_rules(rules, self.clock.now())
            self.hold.changed()
            await self.committer.commit(closed, "commit the incidents a reload closed")
            self.planner.replan()  # new and changed rules are evaluated in full at the next tick: make it now
        self.metrics.reloads.labels(result="ok").inc()
        log.info("rules reloaded: %d rules (%d incidents of changed or removed rules closed)", len(rules),
                 len(closed.incidents))
        await self.committer.audit([reload_record(self.clock.now(), len(rules))])
        return True

    # ------------------------------------------------------------ run
    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set: hold or wait for the lease, then consume, tick and act. An engine runs once:
        stopping closes what it owns."""
        if not self._shared:
            self._gc.start()  # what is loaded by now lives as long as the process: keep it out of collections
        lease = self.lease
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, self._reload.set)
        log.info("engine %s: %d rules from %s", lease.holder, len(self.core.rules),
                 ", ".join(map(str, self.rule_files.paths)) or "(none)")
        consume = guarded_task(self._consume_loop(stop), "engine consume loop")
        loops = [
            guarded_task(self._lease_loop(lease, stop), "engine lease loop"),
            consume,
            guarded_task(self._tick_loop(stop), "engine tick loop"),
            guarded_task(self._reload_loop(stop), "engine reload loop"),
        ]
        for reader in readers_from_config(self.config):
            loops.append(guarded_task(run_reader(reader, self.bus.publish_event, self.config.cluster, self.clock,
                                                 stop, self._reads_demand), f"{reader.scheduler} demand reader"))
        try:
            await until_stop_or_end(loops, stop, "the engine")
        finally:
            # Let the consumer finish its fetch and batch (it checks `stop` between fetches): a
            # pull request cancelled mid-way leaves its messages unacknowledged until ack_wait.
            if stop.is_set() and not consume.done():
                await asyncio.wait([consume], timeout=LAST_BATCH_WAIT_S)
            await stop_tasks(loops, "engine")
            await self._shut_down(lease)
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGHUP)
            if not self._shared:
                self._gc.stop()

    async def _shut_down(self, lease: Lease) -> None:
        """Once the loops have ended: commit and ack the last batch, stop acting, release the lease, write usage."""
        self._stopping.set()
        try:
            await self.hold.settle()  # the last batch's commit and acks
        except (BusError, asyncio.CancelledError) as e:
            log.warning("the last batch was not committed (it will be redelivered): %r", e)
        await self._step_down()
        await lease.release()
        if not self._shared:
            await self._flush_usage()
            self.usage.close()

    async def _lease_loop(self, lease: Lease, stop: asyncio.Event) -> None:
        period = max(0.05, self.config.engine.lease_ttl / 3)
        while not stop.is_set():
            try:
                held = await lease.tick(may_acquire=self.may_acquire is None or self.may_acquire())
            except BusError as e:
                log.warning("lease renewal failed: %s", e)
                held = lease.held
            if held and not self.leader.is_set():
                try:
                    await self._take_over()
                except BusError as e:  # NATS went away half-way: give it back and try again next period
                    log.warning("taking over failed (%s); trying again in %.1fs", e, period)
                    await self._step_down()
            elif not held and self.leader.is_set():
                log.warning("lease lost (NATS unreachable or another holder): this engine stops acting "
                            "and keeps trying to take it back")
                await self._step_down()
            self.metrics.leader.set(1 if self.leader.is_set() else 0)
            self.metrics.clock_offset.set(lease.offset)
            await sleep_or_stop(stop, period)

    async def _take_over(self) -> None:
        """Become the acting engine: restore incidents and snoozes from KV, then consume."""
        stores = self.committer.stores
        # A batch stepped before the lease lapsed may still be committing: KV holds its incidents (and its events
        # are acknowledged, never to come again) only once it is through, so `held()` waits for it first.
        async with self.hold.held() as previous:
            incidents = [i for i in (await stores.incidents.load()).values() if self._owns(i.cluster, i.node)]
            snoozes = list((await stores.snoozes.load()).values())
            limits = (await stores.limits.load()).get(limits_key(self.partition))
            core = Core(previous.rules, self.config)
            core.restore(incidents, snoozes, now=self.clock.now(), limits=limits)
            self.hold.replace(core)
            if (since := awaiting_since(incidents, self.clock.now())) is not None:  # reported while none acted
                await learn(core, self.committer, self.clock.now(), await replayed_outcomes(self.bus, since))
            durable, subjects = self.config.engine.consumer, S.EVENTS_ALL
            if self.partition is not None:
                durable, subjects = f"{durable}-p{self.partition}", S.partition_filter(self.partition)
            self._consumer = await self.bus.consumer(S.STREAM_EVENTS, durable, subjects, ack_wait=60,
                                                     max_ack_pending=50_000, prefetch=True)
            self._subs = [*await serve_requests(self.bus, self.answers),
                          await self.bus.subscribe(S.AUDIT_ALL, self._on_audit)]
        log.info("this engine is acting%s: %d open incidents and %d snoozes restored",
                 "" if self.partition is None else f" for partition {self.partition}", len(incidents), len(snoozes))
        self.leader.set()
        self.ready.set()

    async def give_back(self) -> None:
        """Stop acting and release the lease at once, so another replica takes this partition over (the batch
        in flight is committed first)."""
        async with self.hold.lock:
            try:
                await self.hold.settle_held()
            except BusError as e:
                log.warning("the last batch was not committed (it will be redelivered): %r", e)
            await self._step_down()
            await self.lease.release()

    async def _step_down(self) -> None:
        self.leader.clear()
        await self.answers.close()
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
                await wait_any(stop, self.leader, timeout=1.0)
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
        one's commit and acks in the background, so the next batch is stepped while they are on their way.
        Commits stay in order, one in flight at most; a failed one is raised by the next `handle` or `settle`."""
        async with self.hold.lock:
            core = self.hold.core
            counts: Counter[str] = Counter()
            total = await self._step_batch(core, deliveries, counts)
            self.hold.changed()
            for type_, n in counts.items():
                self.metrics.events.labels(type=type_).inc(n)
            await self.hold.settle_held()  # the previous batch's: this one's is stepped, its commit starts now
            self.hold.commit_behind(self._commit_and_ack(total, deliveries))
            self.planner.stepped(core)
        self._gc.tick(self.hold.size())

    async def _step_batch(self, core: Core, deliveries: list[Delivery], counts: Counter[str]) -> StepResult:
        rejected: list[tuple[Delivery, Exception]] = []
        applied: list[tuple[Delivery, str]] = []

        def events() -> Iterator[tuple[Event, datetime]]:  # decoded one at a time, as the core takes them
            for d in deliveries:
                got = self.acceptor.check(d)
                if isinstance(got, Exception):
                    rejected.append((d, got))
                    continue
                counts[got.type] += 1
                applied.append((d, got.type))
                yield got, self.clock.now()

        batch = core.step_batch(events(), after=self._observe_usage)
        for d, e in rejected:
            await self._dead_letter(d, e)
        for i, e in batch.failed:
            # A schema-valid event the core cannot digest must not stop the fleet's watch, nor come back
            # forever: it is dead-lettered like a malformed one, with the reason.
            d, type_ = applied[i]
            log.error("event %s from %s could not be applied", type_, d.subject, exc_info=e)
            await self._dead_letter(d, e)
        return batch.result

    def _observe_usage(self, item: object, now: datetime) -> None:
        if not isinstance(item, SnapshotEvent):
            return
        # A repeated snapshot is counted from the equal one already held (the usage figures read none of the
        # fields that may differ), so the new copy dies young.
        snap = self.core.state.current_snapshot(item)
        self.usage.observe(item if snap is item.data else item.model_copy(update={"data": snap}), now)

    async def _commit_and_ack(self, result: StepResult, deliveries: list[Delivery]) -> None:
        await self.committer.commit(result, "commit the batch's actions, audit and incidents")
        for d in deliveries:
            await d.ack()

    async def _dead_letter(self, d: Delivery, err: Exception) -> None:
        await self.committer.retry(
            lambda: self.dead_letters.send(d.subject, d.data, err, d.headers.get("Nats-Msg-Id")),
            "store a malformed event in the dead-letter queue")

    async def settle(self) -> None:
        """Wait until the batch in flight is committed and acknowledged (raises what its commit raised)."""
        await self.hold.settle()

    async def _tick_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if not self.leader.is_set():
                await wait_any(stop, self.leader, timeout=1.0)
            elif await self.planner.wait(self.core, stop) and self.leader.is_set():
                await self.tick()
                self.answers.read_side.refresh()  # the read model, published per tick (built in slices meanwhile)

    async def tick(self, now: datetime | None = None) -> StepResult:
        """Step the core through a tick; the periodic sweep of time-dependent rules runs SWEEP_SLICE entities at
        a time, letting the events that arrive meanwhile in between (a slice is evaluated at its own time)."""
        async with self.hold.held() as core:
            result = core.step(Tick(sweep=False), now or self.clock.now())
            self.hold.changed()
            await self.committer.commit(result, "commit a tick")
        for name in result.sweeps:
            rule = core.rules.by_name.get(name)
            if rule is None:
                continue
            keys = list(core.state.by_kind[rule.kind])
            for i in range(0, len(keys), SWEEP_SLICE):
                await asyncio.sleep(0)  # events first
                async with self.hold.held() as current:
                    if not self.leader.is_set() or current is not core:
                        return result  # the lease went, or another core took over: its own ticks sweep
                    part = core.step(Sweep(rule=name, rule_hash=rule.hash, keys=tuple(keys[i:i + SWEEP_SLICE])),
                                     now or self.clock.now())
                    self.hold.changed()
                    await self.committer.commit(part, "commit a sweep")
                result.extend(part)
        self.metrics.observe_fleet(self.core)
        if self.partition is not None and self.leader.is_set():
            await exchange(await self.bus.kv(), self.core, self.partition, self.clock.now().timestamp())
        await self._flush_usage()
        self._gc.tick(self.hold.size())
        return result

    async def _flush_usage(self) -> None:
        """Write the usage rollups counted so far; count the waste they add to the metrics."""
        try:
            delta = await self.usage.flush(self.clock.now())
        except Exception:
            log.exception("usage rollups could not be written; they are kept for the next tick")
            return
        ended, self.usage.ended = self.usage.ended, []
        if self.leader.is_set():  # each ended job's one occasion for its rules (`job.ended_at`)
            for summary in ended:
                self.bus.publish_event(ended_event(summary, self.usage.costs))
        self.metrics.waste.labels(kind="held_idle").inc(delta.held_idle)
        self.metrics.waste.labels(kind="unallocated").inc(delta.unallocated)

    async def _reload_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await wait_any(stop, self._reload, timeout=RELOAD_POLL_S)
            if stop.is_set():
                return
            if self._reload.is_set() or self.rule_files.changed():
                self._reload.clear()
                try:
                    await self.reload()
                except Exception:
                    # LocatedError is handled inside; anything else is a bug, and still no reason to stop
                    # watching the fleet with the rules that run.
                    self.metrics.reloads.labels(result="failed").inc()
                    log.exception("rule reload failed; the previous rules keep running")

    # ------------------------------------------------------------ audit tail, status and snooze (servers.py)
    async def _on_audit(self, msg: Message) -> None:
        self._audit_tail.add(msg.data)
        outcomes = warning_outcomes(msg.data)
        if outcomes:
            async with self.hold.held() as core:
                if self.leader.is_set():
                    await learn(core, self.committer, self.clock.now(), outcomes)
                    self.hold.changed()  # a warning's outcome is shown (status, dashboard): not an older model

    @property
    def audit_tail(self) -> list[AuditRecord]:
        """The newest audit records (ours and the runners'), oldest first, for the dashboard."""
        return self._audit_tail.records()

