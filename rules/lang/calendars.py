"""Calendar helpers for conditions: weekends, national working days and holidays, kube-downscaler windows."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import holidays

_DAYS = {"mon": 0, "tue": 1, "wed": 2, "thu": 3, "fri": 4, "sat": 5, "sun": 6}
_WEEKLY = re.compile(
    r"^(?P<d1>[A-Za-z]{3})-(?P<d2>[A-Za-z]{3})\s+(?P<t1>\d{1,2}:\d{2})-(?P<t2>\d{1,2}:\d{2})(?:\s+(?P<tz>\S+))?$"
)
_ABSOLUTE = re.compile(r"^(?P<a>\d{4}-\d{2}-\d{2}T\S+?)-(?P<b>\d{4}-\d{2}-\d{2}T\S+)$")


class CalendarError(ValueError):
    """A window, country or timezone that cannot be understood."""


def zone(name: str) -> tzinfo:
    """The IANA zone `name`; CalendarError when there is none."""
    try:
        return _zone(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CalendarError(f"unknown timezone {name!r}; use an IANA name like Asia/Shanghai") from None


@lru_cache(maxsize=256)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


@lru_cache(maxsize=64)
def country_calendar(country: str) -> holidays.HolidayBase:
    """The `holidays` calendar of a country code (`CN`, `US`, `DE-BY` for a subdivision)."""
    code, _, subdiv = country.partition("-")
    try:
        return holidays.country_holidays(code.upper(), subdiv=subdiv or None)
    except NotImplementedError:
        raise CalendarError(f"unknown country {country!r} for the holiday calendar; use a code like CN or US") from None
    except Exception as e:
        raise CalendarError(f"holiday calendar {country!r}: {e}") from None


def is_weekend(day: date) -> bool:
    return day.weekday() >= 5


@lru_cache(maxsize=4096)
def is_holiday(country: str, day: date) -> bool:
    """A public holiday (or an official day off) in `country` on `day`."""
    return day in country_calendar(country)


@lru_cache(maxsize=4096)
def is_workday(country: str, day: date) -> bool:
    """A working day by the country's calendar: weekdays that are not holidays, plus weekend days made working days."""
    cal = country_calendar(country)
    cal.get(day)  # populates the year, so `weekend_workdays` knows it
    return bool(cal.is_working_day(day))


def next_workday(country: str, day: date) -> date:
    """The first working day after `day`."""
    d = day + timedelta(days=1)
    for _ in range(60):
        if is_workday(country, d):
            return d
        d += timedelta(days=1)
    raise CalendarError(f"no working day in {country!r} within 60 days of {day}")


@dataclass(frozen=True)
class _Weekly:
    day_from: int
    day_to: int
    start: int  # minutes since midnight
    end: int  # minutes since midnight, 1440 allowed
    tz: tzinfo | None

    def contains(self, now: datetime, default_tz: tzinfo) -> bool:
        local = now.astimezone(self.tz or default_tz)
        minute = local.hour * 60 + local.minute
        wd = local.weekday()
        if self.start <= self.end:
            return self._day_in(wd) and self.start <= minute < self.end
        # overnight (22:00-06:00): the late part belongs to the day it starts, the early part to the day after
        if minute >= self.start:
            return self._day_in(wd)
        return minute < self.end and self._day_in((wd - 1) % 7)

    def _day_in(self, wd: int) -> bool:
        if self.day_from <= self.day_to:
            return self.day_from <= wd <= self.day_to
        return wd >= self.day_from or wd <= self.day_to


@dataclass(frozen=True)
class _Absolute:
    start: datetime
    end: datetime

    def contains(self, now: datetime, default_tz: tzinfo) -> bool:
        return self.start <= now < self.end


@dataclass(frozen=True)
class _Constant:
    value: bool

    def contains(self, now: datetime, default_tz: tzinfo) -> bool:
        return self.value


@dataclass(frozen=True)
class Window:
    """A parsed window: one or more comma-separated parts; inside any part is inside."""

    text: str
    parts: tuple[Any, ...]

    def contains(self, now: datetime, default_tz: tzinfo) -> bool:
        return any(p.contains(now, default_tz) for p in self.parts)


def _minutes(text: str, spec: str) -> int:
    hh, mm = text.split(":")
    h, m = int(hh), int(mm)
    if not (0 <= m < 60 and (0 <= h < 24 or (h == 24 and m == 0))):
        raise CalendarError(f"window {spec!r}: {text!r} is not a time of day (00:00 to 24:00)")
    return h * 60 + m


def _aware(text: str, spec: str) -> datetime:
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise CalendarError(f"window {spec!r}: {text!r} is not an ISO 8601 timestamp") from None
    if dt.tzinfo is None:
        raise CalendarError(f"window {spec!r}: {text!r} needs a UTC offset, like +00:00")
    return dt


@lru_cache(maxsize=1024)
def parse_window(spec: str) -> Window:
    """Parse kube-downscaler's format: `Mon-Fri 07:30-20:30 Europe/Berlin`, several joined by commas,
    absolute `2026-04-01T00:00:00+00:00-2026-04-04T23:59:59+00:00`, or `always` / `never`."""
    parts: list[Any] = []
    for raw in spec.split(","):
        part = raw.strip()
        if not part:
            raise CalendarError(f"window {spec!r}: empty part")
        if part.lower() in ("always", "never"):
            parts.append(_Constant(part.lower() == "always"))
            continue
        m = _WEEKLY.match(part)
        if m:
            d1, d2 = m["d1"].lower(), m["d2"].lower()
            if d1 not in _DAYS or d2 not in _DAYS:
                raise CalendarError(f"window {spec!r}: weekdays are Mon, Tue, Wed, Thu, Fri, Sat, Sun")
            tz = zone(m["tz"]) if m["tz"] else None
            parts.append(_Weekly(_DAYS[d1], _DAYS[d2], _minutes(m["t1"], spec), _minutes(m["t2"], spec), tz))
            continue
        a = _ABSOLUTE.match(part)
        if a:
            start, end = _aware(a["a"], spec), _aware(a["b"], spec)
            if end <= start:
                raise CalendarError(f"window {spec!r}: the end is not after the start")
            parts.append(_Absolute(start, end))
            continue
        raise CalendarError(
            f"window {spec!r}: expected a weekday range and a time range like "
            "'Mon-Fri 07:30-20:30 Europe/Berlin', or 'always' / 'never'"
        )
    return Window(spec, tuple(parts))


def in_window(spec: str, now: datetime, default_tz: tzinfo) -> bool:
    """`now` inside the window; parts without a zone use `default_tz` (the rule's timezone)."""
    return parse_window(spec).contains(now, default_tz)
