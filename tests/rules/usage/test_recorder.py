"""The usage recorder: counting stays on the event loop while a flush writes, so no hour is lost or doubled."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import pytest

from gpuevents.config import CostsConfig
from gpuevents.costs import CostModel
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, SnapshotEvent, make_event
from rules.usage.recorder import UsageRecorder, WasteDelta
from rules.usage.rollup import UsageAggregator, UsageBatch
from rules.usage.store import UsageStore
from tests.rules.dashboard.fleetday import DAY_START
from tests.waiting import wait_for

COSTS = CostModel(CostsConfig())


class OffLoopGate:
    """Holds the first call made off the event loop's thread until released: a flush "in flight"."""

    def __init__(self) -> None:
        self.loop_thread = threading.get_ident()
        self.entered = threading.Event()
        self.release = threading.Event()

    def passing(self) -> None:
        if threading.get_ident() == self.loop_thread or self.entered.is_set():
            return
        self.entered.set()
        if not self.release.wait(timeout=10):
            raise AssertionError("the gate was never released")


class GatedStore(UsageStore):
    """A store whose first write (in the flush's worker thread) waits for the test to let it through."""

    def __init__(self, path: Path, gate: OffLoopGate, fail_writes: int = 0) -> None:
        super().__init__(path)
        self.gate = gate
        self.fail_writes = fail_writes

    def add(self, batch: UsageBatch) -> None:
        self.gate.passing()
        if self.fail_writes:
            self.fail_writes -= 1
            raise OSError("disk full")
        super().add(batch)


def _busy(node: str, t: float) -> SnapshotEvent:
    snap = NodeSnapshot(node=NodeInfo(name=node), gpus=[GpuInfo(node=node, index=0, util_pct=50)])
    return make_event("node.snapshot", node, snap, time=DAY_START + timedelta(seconds=t))


def _recorder(path: Path, gate: OffLoopGate, fail_writes: int = 0) -> UsageRecorder:
    def rated_power_w(_model: str | None) -> float:
        gate.passing()  # counting must never happen in the worker thread
        return 400.0

    aggregator = UsageAggregator(snapshot_interval=15, rated_power_w=rated_power_w)
    return UsageRecorder(aggregator, GatedStore(path, gate, fail_writes), retention_s=86400 * 90, costs=COSTS)


def _busy_s_per_node(path: Path) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    with UsageStore(path) as store:
        for row in store.usage(0, 2**40):
            out[row.node] += row.busy_s
    return dict(out)


def _observe(recorder: UsageRecorder, node: str, t: float) -> None:
    event = _busy(node, t)
    recorder.observe(event, event.time)


async def test_snapshots_observed_while_a_flush_writes_are_counted_exactly_once(tmp_path: Path) -> None:
    gate = OffLoopGate()
    recorder = _recorder(tmp_path / "u.sqlite", gate)
    _observe(recorder, "a", 0)
    _observe(recorder, "b", 0)
    flush = asyncio.create_task(recorder.flush(DAY_START + timedelta(seconds=10)))  # a, b: 0–10 s
    await wait_for(gate.entered.is_set, what="the flush to be in its worker thread")
    _observe(recorder, "a", 15)  # a: 10–15 s
    _observe(recorder, "c", 12)  # a new node while the flush is in flight
    _observe(recorder, "b", 15)  # b: 10–15 s
    gate.release.set()
    first = await flush
    last = await recorder.flush(DAY_START + timedelta(seconds=20))  # a, b: 15–20 s; c: 12–20 s
    recorder.close()
    assert _busy_s_per_node(tmp_path / "u.sqlite") == pytest.approx({"a": 20.0, "b": 20.0, "c": 8.0}, abs=1e-9)
    assert first == last == WasteDelta()  # nothing idle: no waste


def _held_idle(node: str, t: float) -> SnapshotEvent:
    snap = NodeSnapshot(
        node=NodeInfo(name=node),
        gpus=[GpuInfo(node=node, index=0, util_pct=0, idle=True, pids=[7])],
        processes=[ProcessInfo(node=node, pid=7, name="python", owner="alice", create_time=DAY_START)],
    )
    return make_event("node.snapshot", node, snap, time=DAY_START + timedelta(seconds=t))


def _stored(path: Path) -> dict[str, float]:
    """Seconds stored: busy per node, held idle per node, held idle per job."""
    out: dict[str, float] = defaultdict(float)
    with UsageStore(path) as store:
        for r in store.usage(0, 2**40):
            out[f"{r.node} busy"] += r.busy_s
            out[f"{r.node} held"] += r.held_s
        for j in store.idle_jobs(0, 2**40):
            out[f"{j.name} held"] += j.held_s
    return dict(out)


async def _failing_then_working(path: Path, fail_writes: int) -> WasteDelta:
    """Two nodes; the first write fails (or not) while more snapshots arrive; the second flush works."""
    gate = OffLoopGate()
    recorder = _recorder(path, gate, fail_writes)
    for event in (_busy("a", 0), _held_idle("h", 0)):
        recorder.observe(event, event.time)
    flush = asyncio.create_task(recorder.flush(DAY_START + timedelta(seconds=10)))
    await wait_for(gate.entered.is_set, what="the flush to be in its worker thread")
    for event in (_busy("a", 15), _held_idle("h", 15)):  # same buckets as the batch being written
        recorder.observe(event, event.time)
    gate.release.set()
    waste = WasteDelta()
    try:
        waste = await flush
    except OSError as e:
        assert fail_writes and str(e) == "disk full"
    last = await recorder.flush(DAY_START + timedelta(seconds=30))
    recorder.close()
    return WasteDelta(waste.held_idle + last.held_idle, waste.unallocated + last.unallocated)


async def test_a_failed_write_keeps_the_counted_hours_for_the_next_flush(tmp_path: Path) -> None:
    waste = await _failing_then_working(tmp_path / "failed.sqlite", fail_writes=1)
    reference = await _failing_then_working(tmp_path / "ok.sqlite", fail_writes=0)
    expected = {"a busy": 30.0, "a held": 0.0, "h busy": 0.0, "h held": 30.0, "python (pid 7) held": 30.0}
    assert _stored(tmp_path / "failed.sqlite") == pytest.approx(expected, abs=1e-9)
    assert _stored(tmp_path / "ok.sqlite") == pytest.approx(expected, abs=1e-9)
    assert waste.held_idle == pytest.approx(reference.held_idle) and waste.held_idle > 0


async def test_closing_waits_for_a_cancelled_flush_still_writing(tmp_path: Path) -> None:
    """The engine stopping cancels a flush whose worker thread goes on writing: closing SQLite under that thread
    crashed the process (a segmentation fault in the benchmark). Closing waits for the write, which lands whole."""
    gate = OffLoopGate()
    recorder = _recorder(tmp_path / "u.sqlite", gate)
    _observe(recorder, "a", 0)
    flush = asyncio.create_task(recorder.flush(DAY_START + timedelta(seconds=10)))
    await wait_for(gate.entered.is_set, what="the flush to be in its worker thread")
    flush.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flush
    closing = asyncio.create_task(asyncio.to_thread(recorder.close))
    await asyncio.sleep(0.05)  # room for a close that does not wait to happen: the assertion below must hold
    assert not closing.done(), "the store was closed while a worker thread was writing to it"
    gate.release.set()
    await asyncio.wait_for(closing, timeout=10)
    assert _busy_s_per_node(tmp_path / "u.sqlite") == pytest.approx({"a": 10.0}, abs=1e-9)
