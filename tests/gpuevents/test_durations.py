"""Durations as users write them: parsed to seconds, refused with the form they should take, formatted back for
people (two units) and exactly (every unit, read back to the millisecond)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from gpuevents.durations import Duration, DurationError, exact_duration, format_duration, parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90.0), ("15m", 900.0), ("2h", 7200.0), ("1d", 86400.0), ("1w", 604800.0), ("1h30m", 5400.0),
    ("250ms", 0.25), ("1.5h", 5400.0), (" 1h 30m ", 5400.0), (45, 45.0), (2.5, 2.5), ("0s", 0.0),
])
def test_the_forms_users_write_are_read_as_seconds(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2", "h", "2x", "1h30", "-5m", "2h-", "1h 30 m x"])
def test_a_string_that_is_no_duration_is_refused_saying_what_one_looks_like(text: str) -> None:
    with pytest.raises(DurationError, match="duration like 2h"):
        parse_duration(text)


def test_a_negative_number_and_a_boolean_are_refused() -> None:
    with pytest.raises(DurationError, match="negative"):
        parse_duration(-1)
    with pytest.raises(DurationError, match="duration like 2h"):
        parse_duration(True)


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (59.9, "59s"), (60, "1m"), (3661, "1h 1m"), (90061, "1d 1h"), (7200, "2h"), (-5, "0s"),
])
def test_format_for_people_gives_at_most_two_units_and_no_zero_parts(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=0, max_value=10**10))
def test_exact_duration_reads_back_to_the_millisecond(ms: int) -> None:
    assert round(parse_duration(exact_duration(ms / 1000)) * 1000) == ms


class _Window(BaseModel):
    every: Duration


def test_the_pydantic_field_takes_text_or_seconds_and_writes_the_exact_form() -> None:
    assert _Window.model_validate({"every": "1h30m"}).every == 5400.0
    assert _Window.model_validate({"every": 12}).every == 12.0
    assert _Window(every=5400.5).model_dump_json() == '{"every":"1h30m500ms"}'
    with pytest.raises(ValidationError, match="duration like 2h"):
        _Window.model_validate({"every": ["2h"]})
