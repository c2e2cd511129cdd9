"""Running an engine in a test: start it and wait for the lease, end it as a crash would, read what it wrote."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import datetime

import pytest
from nats.js import JetStreamContext

from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.events import Event
from gpuevents.records import ActionRequest, AuditRecord, decode_audit
from rules.engine.partitions.lease import Lease
from rules.engine.service import Engine
from tests.conftest import stored_messages
from tests.waiting import wait_for


@contextlib.asynccontextmanager
async def running(engine: Engine) -> AsyncIterator[Engine]:
    """`engine` running until the block ends, once it holds the lease; then stopped as `stop` stops it."""
    stop = asyncio.Event()
    task = asyncio.create_task(engine.run(stop))
    try:
        await wait_for(lambda: engine.ready.is_set() or task.done(), what="the engine to take the lease")
        if task.done():
            task.result()
        yield engine
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def crash(run: asyncio.Task[None]) -> None:
    """End an engine's `run` task the way a killed process ends: its lease is never released, so a standby
    has to wait for it to lapse."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Lease, "release", _never_released)
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run


async def _never_released(lease: Lease) -> None:
    """A crashed engine never gets to release its lease."""


async def publish(bus: Bus, *events: Event) -> None:
    for e in events:
        bus.publish_event(e)
    assert await bus.flush(5)


def seen(engine: Engine, node: str, at: datetime) -> bool:
    """True once the engine has applied a snapshot of `node` taken at `at`."""
    return any(ns.name == node and ns.last_seen == at for ns in engine.core.state.nodes.values())


def incident(engine: Engine, entity_id: str):  # type: ignore[no-untyped-def]  # callers read it unchecked
    """The open incident on `entity_id`, or None (an Incident | None left untyped: the engine tests read the
    incident they have just waited for without checking for None at each use)."""
    found = [i for i in engine.core.open_incidents() if i.entity_id == entity_id]
    return found[0] if found else None


async def act_requests(js: JetStreamContext) -> list[ActionRequest]:
    return [ActionRequest.model_validate_json(m.data) for m in await stored_messages(js, S.STREAM_ACTIONS)]


async def audit_records(bus: Bus) -> list[AuditRecord]:
    return [r async for m in bus.replay(S.STREAM_AUDIT, S.AUDIT_ALL) for r in decode_audit(m.data)]
