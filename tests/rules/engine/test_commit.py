"""Committing a step's result: a write the bus refuses is retried until it is taken, unless the engine stops."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuevents.bus import BusError
from gpuevents.clock import ManualClock
from rules.core.core import Snooze, StepResult
from rules.core.incidents import Incident
from rules.core.limits import LimitWindows
from rules.engine import commit
from rules.engine.commit import Committer, EngineStores, raise_first
from rules.engine.metrics import EngineMetrics
from rules.engine.store import ModelStore
from tests.rules.engine.conftest import T0


def committer(bus: Any = None, stopping: asyncio.Event | None = None) -> Committer:
    """A Committer whose stores are never reached (the tests below write nothing to KV)."""
    kv: Any = None
    stores = EngineStores(ModelStore(kv, "incident.", Incident), ModelStore(kv, "snooze.", Snooze),
                          ModelStore(kv, "limits.", LimitWindows))
    return Committer(bus, ManualClock(T0), EngineMetrics(), lambda rule: "", stores, partition=None,
                     stopping=stopping or asyncio.Event())


async def test_a_refused_write_is_retried_and_counted_until_the_bus_takes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit, "RETRY_BASE_S", 0.001)
    c = committer()
    calls: list[int] = []

    async def op() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise BusError("JetStream is not answering")

    await c.retry(op, "write")
    assert len(calls) == 3
    assert c.metrics.bus_retries._value.get() == 2


async def test_a_stopping_engine_gives_up_at_the_first_refusal() -> None:
    stopping = asyncio.Event()
    c = committer(stopping=stopping)
    stopping.set()

    async def op() -> None:
        raise BusError("gone")

    with pytest.raises(BusError, match="gone"):
        await c.retry(op, "write")
    assert c.metrics.bus_retries._value.get() == 0


async def test_an_empty_result_writes_nothing() -> None:
    await committer(bus=object()).commit(StepResult(), "nothing")  # the bus is never touched


def test_raise_first_raises_the_first_error_of_a_pipelined_write() -> None:
    raise_first([1, 2])
    with pytest.raises(BusError, match="first"):
        raise_first([1, BusError("first"), BusError("second")])
