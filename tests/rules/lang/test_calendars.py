"""Calendars: weekends and windows across DST zones, Chinese holidays and adjusted working days."""

from __future__ import annotations

from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest

from rules.lang.calendars import (
    CalendarError,
    in_window,
    is_holiday,
    is_workday,
    next_workday,
    parse_window,
)

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
SHANGHAI = ZoneInfo("Asia/Shanghai")


@pytest.mark.parametrize(
    ("day", "workday"),
    [
        (date(2026, 2, 13), True),   # Friday before Spring Festival
        (date(2026, 2, 14), True),   # Saturday made a working day
        (date(2026, 2, 15), False),  # Sunday
        (date(2026, 2, 17), False),  # Spring Festival
        (date(2026, 2, 20), False),  # Friday off, substituted from 14 February
        (date(2026, 2, 23), False),  # Monday off, substituted from 28 February
        (date(2026, 2, 24), True),
        (date(2026, 2, 28), True),   # Saturday made a working day
        (date(2026, 3, 1), False),   # an ordinary Sunday
        (date(2026, 10, 1), False),  # National Day
        (date(2026, 10, 10), True),  # Saturday made a working day
    ],
)
def test_chinese_working_days_include_adjusted_weekends(day: date, workday: bool) -> None:
    assert is_workday("CN", day) is workday


def test_holidays_and_days_off_are_holidays_but_adjusted_saturdays_are_not() -> None:
    assert is_holiday("CN", date(2026, 2, 17))
    assert is_holiday("CN", date(2026, 2, 20))
    assert not is_holiday("CN", date(2026, 2, 14))


def test_next_working_day_after_spring_festival() -> None:
    assert next_workday("CN", date(2026, 2, 15)) == date(2026, 2, 24)


def test_a_us_holiday_on_a_weekday_is_no_workday() -> None:
    assert not is_workday("US", date(2026, 7, 3))  # Independence Day observed (Friday)
    assert is_workday("US", date(2026, 7, 6))


def test_an_unknown_country_is_an_error() -> None:
    with pytest.raises(CalendarError):
        is_workday("XX", date(2026, 1, 1))


@pytest.mark.parametrize(
    ("utc_time", "inside"),
    [
        (datetime(2026, 1, 5, 6, 29, tzinfo=UTC), False),   # 07:29 CET Monday
        (datetime(2026, 1, 5, 6, 30, tzinfo=UTC), True),    # 07:30 CET: start is inside
        (datetime(2026, 1, 5, 19, 29, tzinfo=UTC), True),   # 20:29 CET
        (datetime(2026, 1, 5, 19, 30, tzinfo=UTC), False),  # 20:30 CET: end is outside
        (datetime(2026, 7, 6, 5, 30, tzinfo=UTC), True),    # 07:30 CEST: the zone follows DST
        (datetime(2026, 7, 6, 6, 29, tzinfo=UTC), True),
        (datetime(2026, 7, 6, 18, 30, tzinfo=UTC), False),  # 20:30 CEST
        (datetime(2026, 1, 10, 12, 0, tzinfo=UTC), False),  # Saturday
    ],
)
def test_kube_downscaler_window_with_a_zone(utc_time: datetime, inside: bool) -> None:
    assert in_window("Mon-Fri 07:30-20:30 Europe/Berlin", utc_time, ZoneInfo("UTC")) is inside


def test_a_window_without_a_zone_uses_the_rules_timezone() -> None:
    t = datetime(2026, 1, 5, 13, 0, tzinfo=UTC)  # 08:00 in New York, 21:00 in Shanghai
    assert in_window("Mon-Fri 07:30-20:30", t, NEW_YORK)
    assert not in_window("Mon-Fri 07:30-20:30", t, SHANGHAI)


def test_whole_days_to_midnight_and_lists_of_windows() -> None:
    w = "Fri-Fri 20:00-24:00, Sat-Sun 00:00-24:00, Mon-Mon 00:00-07:00"
    assert in_window(w, datetime(2026, 1, 9, 20, 0, tzinfo=BERLIN), BERLIN)
    assert in_window(w, datetime(2026, 1, 9, 23, 59, tzinfo=BERLIN), BERLIN)
    assert in_window(w, datetime(2026, 1, 11, 12, 0, tzinfo=BERLIN), BERLIN)
    assert in_window(w, datetime(2026, 1, 12, 6, 59, tzinfo=BERLIN), BERLIN)
    assert not in_window(w, datetime(2026, 1, 12, 7, 0, tzinfo=BERLIN), BERLIN)
    assert not in_window(w, datetime(2026, 1, 9, 19, 59, tzinfo=BERLIN), BERLIN)


def test_weekday_ranges_may_wrap_and_times_may_cross_midnight() -> None:
    assert in_window("Fri-Mon 00:00-24:00", datetime(2026, 1, 11, 12, tzinfo=UTC), UTC)  # Sunday
    assert not in_window("Fri-Mon 00:00-24:00", datetime(2026, 1, 7, 12, tzinfo=UTC), UTC)  # Wednesday
    night = "Mon-Fri 22:00-06:00"
    assert in_window(night, datetime(2026, 1, 9, 23, 0, tzinfo=UTC), UTC)      # Friday night
    assert in_window(night, datetime(2026, 1, 10, 5, 0, tzinfo=UTC), UTC)      # early Saturday: Friday's night
    assert not in_window(night, datetime(2026, 1, 5, 5, 0, tzinfo=UTC), UTC)   # early Monday: Sunday's night


def test_absolute_windows_always_and_never() -> None:
    w = "2026-04-01T00:00:00+00:00-2026-04-04T23:59:59+00:00"
    assert in_window(w, datetime(2026, 4, 2, tzinfo=UTC), UTC)
    assert not in_window(w, datetime(2026, 4, 5, tzinfo=UTC), UTC)
    assert in_window("always", datetime(2026, 4, 5, tzinfo=UTC), UTC)
    assert not in_window("never", datetime(2026, 4, 5, tzinfo=UTC), UTC)


def test_dst_gap_and_fold_in_new_york() -> None:
    # 2026-03-08: 02:00 EST jumps to 03:00 EDT. 07:00 UTC is 03:00 EDT.
    assert in_window("Sun-Sun 03:00-04:00", datetime(2026, 3, 8, 7, 0, tzinfo=UTC), NEW_YORK)
    # 2026-11-01: 01:00-02:00 happens twice; both are inside a 01:00-02:00 window.
    assert in_window("Sun-Sun 01:00-02:00", datetime(2026, 11, 1, 5, 30, tzinfo=UTC), NEW_YORK)
    assert in_window("Sun-Sun 01:00-02:00", datetime(2026, 11, 1, 6, 30, tzinfo=UTC), NEW_YORK)


@pytest.mark.parametrize(
    "spec",
    ["Mon-Fri", "Mon-Fri 07:30", "Mon-Xyz 07:30-20:30", "Mon-Fri 7:30-25:00", "Mon-Fri 07:60-08:00",
     "Mon-Fri 07:30-20:30 Mars/Base", "2026-04-01T00:00:00-2026-04-02T00:00:00", "", "Mon-Fri 07:30-20:30,"],
)
def test_malformed_windows_are_errors(spec: str) -> None:
    with pytest.raises(CalendarError):
        parse_window(spec)
