"""Agent clocks the engine does not believe: times moved onto the server's clock, never a negative duration."""

from __future__ import annotations

from datetime import timedelta

from gpuevents.events import SnapshotEvent
from rules.intake.skew import SkewGuard
from tests.rules.engine.conftest import T0, snapshot


def test_a_node_ten_minutes_fast_has_its_times_moved_onto_the_servers_clock() -> None:
    guard = SkewGuard(60)
    stored = T0
    fast = snapshot("n1", T0 + timedelta(minutes=10), idle_since=T0 + timedelta(minutes=5))
    got = guard.check(fast, stored)
    assert isinstance(got, SnapshotEvent) and got.time == T0
    assert got.data.gpus[0].idle_since == T0 - timedelta(minutes=5)  # idle for 5 minutes, as the agent saw it
    assert got.data.processes[0].create_time == fast.data.processes[0].create_time - timedelta(minutes=10)
    assert guard.skewed == {"node/n1": 600.0} and guard.events == 1


def test_a_snapshot_dated_1970_or_2100_is_not_believed() -> None:
    guard = SkewGuard(60)
    for year in (1970, 2100):
        when = T0.replace(year=year)
        got = guard.check(snapshot("n1", when, idle_since=when - timedelta(minutes=1)), T0)
        assert isinstance(got, SnapshotEvent)
        assert got.time == T0 and got.data.gpus[0].idle_since == T0 - timedelta(minutes=1)


def test_small_skew_and_a_buffered_event_are_believed() -> None:
    guard = SkewGuard(60)
    late = snapshot("n1", T0)
    assert guard.check(late, T0 + timedelta(seconds=2)) is late
    buffered = snapshot("n2", T0)  # the agent buffered it through an outage and published it an hour later
    assert guard.check(buffered, T0 + timedelta(hours=1)) is buffered
    assert guard.skewed == {}
