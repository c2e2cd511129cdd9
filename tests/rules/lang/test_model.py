"""`schedule:` reads as crontab(5): weekday numbers from Sunday = 0 (7 too), names, ranges and steps as cron
counts them, and a day that matches either restricted day field fires."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuevents.yamlpos import LocatedError
from rules.lang.model import crontab_weekdays
from tests.rules.helpers import rules_from

MONDAY = datetime(2026, 1, 5, tzinfo=UTC)


def fire_days(tmp_path: Path, schedule: str, days: int = 14) -> list[str]:
    rules = rules_from(tmp_path, f"""\
rules:
  - name: weekly
    entity: node
    when: node.online
    schedule: "{schedule}"
    actions: [{{type: log, message: m}}]
""")
    rule = rules.by_name["weekly"]
    out: list[str] = []
    t = MONDAY - timedelta(seconds=1)
    while (fire := rule.next_cron(t)) is not None and fire < MONDAY + timedelta(days=days):
        out.append(fire.strftime("%a %d"))
        t = fire
    return out


@pytest.mark.parametrize("field, days", [
    ("1-5/2", [1, 3, 5]),
    ("*/2", [0, 2, 4, 6]),
    ("0-6", [0, 1, 2, 3, 4, 5, 6]),
    ("SUN-SAT", [0, 1, 2, 3, 4, 5, 6]),
    ("mon-fri", [1, 2, 3, 4, 5]),
    ("7", [0]),
    ("0,7,sat", [0, 6]),
    ("1-7", [0, 1, 2, 3, 4, 5, 6]),
    ("fri/1", [5, 6]),
])
def test_weekday_fields_read_as_crontab_counts_them(field: str, days: list[int]) -> None:
    assert crontab_weekdays(field) == days


def test_a_stepped_weekday_range_fires_on_monday_wednesday_and_friday(tmp_path: Path) -> None:
    assert fire_days(tmp_path, "0 20 * * 1-5/2", days=7) == ["Mon 05", "Wed 07", "Fri 09"]


def test_every_other_day_of_the_week_starts_on_sunday(tmp_path: Path) -> None:
    assert fire_days(tmp_path, "0 9 * * */2", days=7) == ["Tue 06", "Thu 08", "Sat 10", "Sun 11"]


def test_zero_to_six_and_names_load(tmp_path: Path) -> None:
    assert len(fire_days(tmp_path, "0 9 * * 0-6", days=7)) == 7
    assert len(fire_days(tmp_path, "0 9 * * SUN-SAT", days=7)) == 7


def test_day_of_month_or_day_of_week_fires_when_both_are_restricted(tmp_path: Path) -> None:
    # crontab(5): "30 4 1,15 * 5" runs on the 1st and 15th of each month as well as on every Friday
    assert fire_days(tmp_path, "30 4 15 * 5", days=14) == ["Fri 09", "Thu 15", "Fri 16"]


def test_a_bad_weekday_is_a_load_error_at_its_line(tmp_path: Path) -> None:
    with pytest.raises(LocatedError) as e:
        fire_days(tmp_path, "0 9 * * 8")
    assert "rules.yaml:5: schedule:" in str(e.value) and "weekday 8 is not 0-7" in str(e.value)
