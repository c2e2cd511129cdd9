"""The clocks: the system's is aware UTC; the manual one moves only when told, never backwards, and keeps its
monotonic reading in step."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from gpuevents.clock import ManualClock, SystemClock, utc

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def test_the_system_clock_is_aware_utc_and_monotonic_does_not_go_back() -> None:
    clock = SystemClock()
    now = clock.now()
    assert now.tzinfo is not None and now.utcoffset() == timedelta(0)
    first = clock.monotonic()
    assert clock.monotonic() >= first


def test_the_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(T0)
    assert (clock.now(), clock.monotonic()) == (T0, 0.0)
    assert clock.advance(90) == T0 + timedelta(seconds=90)
    clock.set(T0 + timedelta(hours=1))
    assert (clock.now(), clock.monotonic()) == (T0 + timedelta(hours=1), 3600.0)


def test_the_manual_clock_refuses_to_go_back_or_to_start_naive() -> None:
    clock = ManualClock(T0)
    with pytest.raises(ValueError, match="does not go backwards"):
        clock.set(T0 - timedelta(seconds=1))
    assert clock.now() == T0
    with pytest.raises(ValueError, match="aware"):
        ManualClock(datetime(2026, 1, 5))


def test_a_manual_clock_started_in_another_zone_reads_utc() -> None:
    clock = ManualClock(datetime(2026, 1, 5, 10, 0, tzinfo=timezone(timedelta(hours=1))))
    assert clock.now() == T0 and clock.now().tzinfo == UTC


def test_utc_takes_naive_as_utc_and_converts_aware() -> None:
    assert utc(datetime(2026, 1, 5, 9, 0)) == T0
    assert utc(datetime(2026, 1, 5, 4, 0, tzinfo=timezone(timedelta(hours=-5)))).hour == 9
