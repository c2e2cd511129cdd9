"""The action runner: takes requests from GPUEVENTS_ACT, runs each safely once, audits every outcome."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Self

from pydantic import ValidationError

from actions import approvals, convergence, evidence, registry
from actions.ledger import Claim, Ledger, LedgerEntry
from actions.protocol import Action, ActionContext, ActionResult, Deferred, PermanentError, TransientError
from actions.services import Services, WeeklySummary
from actions.store import KeyValue
from gpuevents import subjects as S
from gpuevents.aio import backoff_delay, guarded_task, sleep_or_stop, stop_tasks
from gpuevents.bus import Bus, BusError, Delivery
from gpuevents.clock import Clock, SystemClock
from gpuevents.config import Config
from gpuevents.durations import format_duration
from gpuevents.events import new_id
from gpuevents.protection import protection_reason
from gpuevents.records import ActionRequest, AuditRecord, Outcome

log = logging.getLogger(__name__)

SECRET_PARAM_KEYS = frozenset({"authorization", "token", "password", "secret", "api_key", "x-api-key",
                               "cookie"})
CLAIM_MARGIN_S = 30.0  # past its deadline plus this, a `running` claim is a dead runner's
BUSY_RECHECK_S = 5.0
LEDGER_KEEP_S = 7 * 86400.0  # how long a finished key still blocks a rerun
PRUNE_EVERY_S = 3600.0


@dataclass(frozen=True)
class _Retry:
    delay: float
    error: str
    deferred: bool = False
    record: AuditRecord | None = None  # a remedy's failed try, audited as it happens (actions/convergence.py)


@dataclass(frozen=True)
class _AlreadyDone:
    entry: LedgerEntry
    claim: Claim


@dataclass(frozen=True)
class _Busy:
    entry: LedgerEntry


@dataclass(frozen=True)
class _Final:
    record: AuditRecord
    claim: Claim | None = None
    permanent: bool = False


_Step = _Final | _Retry | _AlreadyDone | _Busy


def redact(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters as the audit keeps them: secrets (an Authorization header, a token) masked."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        if k.lower() in SECRET_PARAM_KEYS:
            out[k] = "***"
        elif isinstance(v, dict):
            out[k] = redact(v)
        else:
            out[k] = v
    return out


class ActionRunner:
    """Several runners may share the one durable consumer: JetStream spreads requests among them,
    and the KV ledger makes sure one request runs once, whoever gets it and however often."""

    def __init__(self, config: Config, services: Services, ledger: Ledger, *, bus: Bus | None, runner_id: str,
                 concurrency: int = 16, ack_wait: float = 30.0) -> None:
        """Every part given whole; `ActionRunner.open` builds them. Without a bus (`bus=None`) the runner only
        `process`es requests in the caller's task."""
        self.bus = bus
        self.config = config
        self.services = services
        self.ledger = ledger
        self.clock: Clock = services.clock
        self.id = runner_id
        self.concurrency = concurrency
        self.ack_wait = ack_wait
        self.durable = f"{config.engine.consumer}-actions"
        self._instances: dict[str, Action[Any]] = {}
        self._rng = random.Random()

    @classmethod
    async def open(cls, bus: Bus | None, config: Config, clock: Clock | None = None, *, name: str = "runner",
                   kv: KeyValue | None = None, concurrency: int = 16, ack_wait: float = 30.0,
                   report: WeeklySummary | None = None) -> Self:
        """A runner with its services and ledger open: on the bus's KV store, or `kv`, or (no bus) in memory."""
        if kv is None and bus is not None:
            kv = await bus.kv()
        runner_id = f"{name}-{new_id()}"
        services = Services(config, bus=bus, kv=kv, clock=clock or SystemClock(), report=report)
        return cls(config, services, Ledger(services.kv, runner_id), bus=bus, runner_id=runner_id,
                   concurrency=concurrency, ack_wait=ack_wait)

    # ------------------------------------------------------------ lifecycle
    async def close(self) -> None:
        await self.services.close()

    def _instance(self, type_: str) -> Action[Any]:
        """One instance of the action's runtime per runner (its caches live on it), imported on first use."""
        inst = self._instances.get(type_)
        if inst is None:
            inst = self._instances[type_] = registry.runtime(type_)()
        return inst

    def load_runtimes(self) -> list[str]:
        """Import every action's runtime now (a runner that consumes the queue does, before its first request),
        so no request waits on an import; the types whose runtime will not load are logged and returned, and
        their requests fail one by one."""
        broken = []
        for type_ in registry.types():
            try:
                self._instance(type_)
            except Exception as e:
                log.error("the runtime of action %s will not load: %s: %s", type_, type(e).__name__, e)
                broken.append(type_)
        return broken

    # ------------------------------------------------------------ one attempt
    def _record(self, req: ActionRequest, outcome: Outcome, *, attempt: int = 0, error: str | None = None,
                detail: str | None = None, params: dict[str, Any] | None = None,
                slot_freed: bool = False) -> AuditRecord:
        return AuditRecord(
            time=self.clock.now(), kind="action", rule=req.rule, entity_id=req.entity_id,
            cluster=req.cluster, incident_id=req.incident_id, action_type=req.type, action_key=req.key,
            outcome=outcome, attempt=attempt, error=error, detail=detail,
            params=redact(registry.readable(req.type, params if params is not None else req.params)),
            dry_run=req.dry_run or self.config.engine.dry_run, facts=req.facts, slot_freed=slot_freed,
        )

    async def _attempt(self, req: ActionRequest) -> _Step:
        if req.decision != "run":
            # The engine decided (limits, snooze, its own dry run): record it, run nothing.
            return _Final(self._record(req, req.decision, detail=req.reason,
                                       error=req.reason if req.decision == "refused" else None))
        try:
            cls = registry.get(req.type)
            params = registry.parse_params(req.type, req.params)
        except registry.UnknownActionError as e:
            return _Final(self._record(req, "refused", error=str(e)))
        except registry.ParamsError as e:
            return _Final(self._record(req, "refused", error=f"{req.type} parameters: {e}"))
        if req.entity_kind not in cls.entity_kinds:
            kinds = ", ".join(sorted(cls.entity_kinds))
            return _Final(self._record(req, "refused", error=f"{req.type} acts on {kinds}, "
                                       f"not on a {req.entity_kind}"))
        destructive = cls.destructive or req.destructive
        if destructive:
            why = protection_reason(req, self.config.protect)
            if why is not None:
                return _Final(self._record(req, "refused", error=f"protected: {why}",
                                           slot_freed=req.phase != "resolve"))
        decided_at = req.created_at
        if req.approve and not (req.dry_run or self.config.engine.dry_run):
            # a destructive action with `approve:`, or an owner's keep longer than the rule's snooze_max
            status, info = await approvals.gate(req, self.services.kv, self.config, self.clock.now())
            if status == "pending":
                return _Retry(float(info), f"waiting for an approval from {req.approve}", deferred=True)
            if status == "denied":
                return _Final(self._record(req, "refused", error=f"denied by {info} in {req.approve}"))
            if status == "expired":
                return _Final(self._record(req, "expired", detail=info))
            # approved: the decision is as old as the approval (or the request, made after a shared approval)
            decided_at = max(datetime.fromisoformat(info), req.created_at)
        if destructive:
            age = (self.clock.now() - decided_at).total_seconds()
            if age > self.config.engine.request_ttl and not await _tried(self.ledger, req.key):
                return _Final(self._record(req, "expired", detail=(
                    f"decided {format_duration(age)} ago, longer than engine.request_ttl "
                    f"({format_duration(self.config.engine.request_ttl)}): not acting on an old decision")))
        dump = params.model_dump(mode="json")
        if req.dry_run or self.config.engine.dry_run:
            return _Final(self._record(req, "dry_run", detail=f"dry run: {req.type} not executed",
                                       params=dump))
        try:
            instance = self._instance(req.type)
        except Exception as e:  # a plugin's runtime that will not import: fail it, keep the runner
            log.exception("the runtime of action %s failed to load", req.type)
            return _Final(self._record(req, "failed", params=dump, error=(
                f"cannot load the runtime of {req.type}: {type(e).__name__}: {e}")), permanent=True)
        timeout = instance.run_timeout(params, self.config.actions.timeout)
        now = self.clock.now()
        claim = await self.ledger.claim(req.key, now, now + timedelta(seconds=timeout + CLAIM_MARGIN_S))
        if not claim.won:
            assert claim.entry is not None
            if claim.done:
                return _AlreadyDone(claim.entry, claim)
            return _Busy(claim.entry)
        assert claim.entry is not None
        attempt = claim.entry.attempts
        ctx = ActionContext(request=req, params=params, config=self.config, services=self.services, attempt=attempt)
        return await self._execute(self.ledger, claim, instance, ctx, timeout, dump)

    async def _execute(self, ledger: Ledger, claim: Claim, instance: Action[Any], ctx: ActionContext,
                       timeout: float, dump: dict[str, Any]) -> _Step:
        req, attempt = ctx.request, ctx.attempt
        retry = self.config.actions.retry
        destructive = type(instance).destructive or req.destructive
        try:
            result: ActionResult = await asyncio.wait_for(_confirmed_run(instance, ctx), timeout)
        except Deferred as d:
            await ledger.release(claim, "deferred")
            return _Retry(max(d.delay, 0.0), str(d), deferred=True)
        except (TransientError, TimeoutError) as e:
            error = str(e) if isinstance(e, TransientError) else f"timed out after {timeout:.1f}s"
            if not await convergence.keep_trying(ctx.services.kv, req, destructive, attempt, retry,
                                                 self.clock.now()):
                return await self._finish(ledger, claim, self._record(
                    req, "failed", attempt=attempt, params=dump,
                    error=f"gave up after {attempt} attempts: {error}"))
            delay = e.delay if isinstance(e, TransientError) and e.delay is not None else \
                backoff_delay(attempt, retry.backoff, retry.backoff_max, self._rng)
            log.warning("%s %s (attempt %d/%d) failed, retrying in %.1fs: %s",
                        req.type, req.key, attempt, retry.max_attempts, delay, error)
            await ledger.release(claim, "retry")
            tried = self._record(req, "failed", attempt=attempt, params=dump, error=error,
                                 detail=f"try {attempt} failed; trying again in {format_duration(delay)}") \
                if destructive else None
            return _Retry(delay, error, record=tried)
        except PermanentError as e:
            return await self._finish(ledger, claim, self._record(
                req, "failed", attempt=attempt, params=dump, error=str(e)), permanent=True)
        except Exception as e:  # a bug in an action must not take the runner down
            log.exception("action %s (%s) raised", req.type, req.key)
            return await self._finish(ledger, claim, self._record(
                req, "failed", attempt=attempt, params=dump, error=f"{type(e).__name__}: {e}"),
                permanent=True)
        failed = result.status != "ok"
        record = self._record(req, result.status, attempt=attempt, params=dump,
                              detail=result.detail or None, error=result.detail if failed else None,
                              slot_freed=result.status == "refused" and req.phase != "resolve"
                              and bool(result.data.get("slot_freed")))
        return await self._finish(ledger, claim, record)

    async def _finish(self, ledger: Ledger, claim: Claim, record: AuditRecord,
                      permanent: bool = False) -> _Final:
        return _Final(record, await ledger.finish(claim, record), permanent)

    # ------------------------------------------------------------ audit
    async def _audit(self, record: AuditRecord, claim: Claim | None, *, one_try: bool = False) -> None:
        """Publish to `gpuevents.audit.<rule>`; the message id makes a re-publish land once (each of a remedy's
        failed tries once: `one_try`)."""
        log.info("audit %s %s %s: %s%s", record.rule, record.action_type, record.entity_id,
                 record.outcome, f" ({record.error or record.detail})" if record.error or record.detail else "")
        if self.bus is None:
            return
        await self.bus.js_publish(S.audit_subject(record.rule), record.model_dump_json().encode(),
                                  msg_id=f"audit:{record.action_key}:{record.outcome}"
                                  + (f":try{record.attempt}" if one_try else ""))
        if claim is not None:
            await self.ledger.mark_audited(claim)

    # ------------------------------------------------------------ without the bus loop
    async def process(self, request: ActionRequest) -> AuditRecord:
        """Run one request to its final outcome in this task (retries sleep here), audit it, return it.

        For tests and dry runs; a request that already ran returns its first record, unrun.
        """
        while True:
            step = await self._attempt(request)
            if isinstance(step, _Final):
                await self._audit(step.record, step.claim)
                return step.record
            if isinstance(step, _Retry):
                if step.record is not None:
                    await self._audit(step.record, None, one_try=True)
                await asyncio.sleep(step.delay)
            elif isinstance(step, _AlreadyDone):
                record = step.entry.record
                assert record is not None
                if not step.entry.audited:
                    await self._audit(record, step.claim)
                return record
            else:
                await self._wait_for_other_runner(request)

    async def _wait_for_other_runner(self, request: ActionRequest) -> None:
        while True:
            found = await self.ledger.read(request.key)
            if found is None or found[0].state != "running":
                return
            deadline = found[0].deadline
            if deadline is not None and deadline <= self.clock.now():
                return
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------ the bus loop
    async def handle(self, delivery: Delivery) -> None:
        """One delivery from GPUEVENTS_ACT: ack when done, nak(delay) to retry, term when hopeless."""
        assert self.bus is not None
        try:
            request = ActionRequest.model_validate_json(delivery.data)
        except ValidationError as e:
            log.error("malformed action request on %s, sent to the DLQ: %s", delivery.subject,
                      e.errors()[0]["msg"])
            with contextlib.suppress(BusError):
                await self.bus.js_publish(S.dlq_subject(delivery.subject), delivery.data)
            await delivery.term()
            return
        async with _keep_alive(delivery, self.ack_wait / 3):
            try:
                step = await self._attempt(request)
                if isinstance(step, _Final):
                    await self._audit(step.record, step.claim)
                    await (delivery.term() if step.permanent else delivery.ack())
                elif isinstance(step, _Retry):
                    if step.record is not None:
                        await self._audit(step.record, None, one_try=True)
                    await delivery.nak(delay=step.delay)
                elif isinstance(step, _AlreadyDone):
                    if not step.entry.audited and step.entry.record is not None:
                        await self._audit(step.entry.record, step.claim)
                    await delivery.ack()
                else:  # another runner has it right now: look again soon, then less often
                    await delivery.nak(delay=min(BUSY_RECHECK_S, 0.25 * 2 ** (delivery.num_delivered - 1)))
            except BusError as e:
                log.warning("action %s: the bus failed mid-way (%s); it will be redelivered", request.key, e)
                await delivery.nak(delay=2.0)

    async def run(self, stop: asyncio.Event) -> None:
        """Consume GPUEVENTS_ACT until `stop` is set, up to `concurrency` requests at once."""
        assert self.bus is not None, "run() needs a bus; use process() without one"
        self.load_runtimes()
        consumer = await self.bus.consumer(S.STREAM_ACTIONS, self.durable, S.ACTIONS_ALL,
                                           ack_wait=self.ack_wait, max_deliver=-1,
                                           max_ack_pending=max(self.concurrency * 64, 1024))
        tasks: set[asyncio.Task[None]] = set()
        pruner = guarded_task(self._prune_forever(stop), f"{self.id}: pruning the ledger")
        try:
            while not stop.is_set():
                free = self.concurrency - len(tasks)
                if free <= 0:
                    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    continue
                for d in await consumer.fetch(free, timeout=0.5):
                    # A failure is logged by name and the delivery, never acked, comes back.
                    task = guarded_task(self.handle(d), f"{self.id}: handling {d.subject}")
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        finally:
            await stop_tasks([pruner], self.id)
            if tasks:
                await asyncio.wait(tasks)
            await consumer.close()
            await self.close()  # the HTTP session and Kubernetes client: a clean stop leaves nothing open

    async def _prune_forever(self, stop: asyncio.Event) -> None:
        while True:
            try:
                removed = await self.ledger.prune(self.clock.now(), LEDGER_KEEP_S)
                if removed:
                    log.info("forgot %d action keys finished more than %s ago", removed,
                             format_duration(LEDGER_KEEP_S))
            except Exception as e:  # never let housekeeping end the runner
                log.warning("pruning the action ledger failed: %s: %s", type(e).__name__, e)
            if await sleep_or_stop(stop, PRUNE_EVERY_S):
                return


async def _tried(ledger: Ledger, key: str) -> bool:
    """Whether this request ran before: a retry of a remedy acts on its decision as long as its incident is open
    (actions/convergence.py), however old; a first try only within engine.request_ttl."""
    found = await ledger.read(key)
    return found is not None and found[0].attempts > 0


async def _confirmed_run(instance: Action[Any], ctx: ActionContext) -> ActionResult:
    """Run the action on what the source of truth confirms (actions/evidence.py), never on a node's claim alone."""
    try:
        confirmed = await evidence.confirm(ctx)
    except evidence.Refused as e:  # for an exemption or a contradicted claim: no max_per_hour slot taken
        return ActionResult(status="refused", detail=evidence.refusal(e, ctx.request), data={"slot_freed": True})
    if confirmed is not ctx.request:
        ctx = ActionContext(request=confirmed, params=ctx.params, config=ctx.config, services=ctx.services,
                            attempt=ctx.attempt)
    return await instance.run(ctx.params, ctx)


@contextlib.asynccontextmanager
async def _keep_alive(delivery: Delivery, every: float) -> AsyncIterator[None]:
    """Tell JetStream we are still at it, so a long kill is not redelivered to another runner."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(every)
            with contextlib.suppress(BusError):
                await delivery.in_progress()

    task = guarded_task(beat(), f"keeping {delivery.subject} in progress")
    try:
        yield
    finally:
        await stop_tasks([task], "action keep-alive")

