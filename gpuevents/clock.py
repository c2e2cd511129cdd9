"""The clock, passed in wherever time matters, so the core stays pure and tests run on virtual time."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Aware UTC now."""
        ...

    def monotonic(self) -> float:
        """Seconds for measuring intervals."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told; for tests, rule tests and backtests."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("ManualClock needs an aware datetime")
        self._now = start.astimezone(UTC)
        self._mono = 0.0

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> datetime:
        self._now += timedelta(seconds=seconds)
        self._mono += seconds
        return self._now

    def set(self, when: datetime) -> None:
        delta = (when - self._now).total_seconds()
        if delta < 0:
            raise ValueError("ManualClock does not go backwards")
        self.advance(delta)


def utc(dt: datetime) -> datetime:
    """`dt` as aware UTC; naive datetimes are taken as UTC."""
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
