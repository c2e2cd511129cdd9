"""What a condition may use, and Jinja2's parse of it: one expression only, errors with their line, too long or
too deep refused with the limit; the names as Jinja2 sees them carry the evaluation instant in the rule's zone
and the helpers on that day."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from jinja2 import nodes

from rules.lang.expr.names import (
    CLOCK_KEY,
    ENTITY_NAMES,
    MAX_DEPTH,
    MAX_SOURCE_CHARS,
    TIME_HELPERS,
    ExprError,
    jinja_names,
    parse_expression,
)
from rules.lang.views import EvalClock


def test_one_expression_parses_to_jinja2s_tree() -> None:
    tree = parse_expression("gpu.idle and gpu.util_pct < 5")
    assert isinstance(tree, nodes.And)


def test_anything_after_the_expression_is_a_syntax_error_on_its_line() -> None:
    with pytest.raises(ExprError, match=r"syntax error: unexpected 'b' after the expression") as e:
        parse_expression("gpu.idle\n  b")
    assert e.value.line == 2
    with pytest.raises(ExprError, match="syntax error") as e:
        parse_expression("gpu.idle and (")
    assert e.value.line == 1


def test_a_condition_too_long_is_refused_with_the_limit() -> None:
    with pytest.raises(ExprError, match=f"at most {MAX_SOURCE_CHARS}: split it"):
        parse_expression("1 + " * MAX_SOURCE_CHARS + "1")


def test_a_condition_nesting_deeper_than_python_can_parse_is_refused_with_the_limit() -> None:
    with pytest.raises(ExprError, match=f"nests too deeply; at most {MAX_DEPTH} levels"):
        parse_expression("(" * 2000 + "1" + ")" * 2000)


def test_every_entity_kind_sees_itself_entity_and_demand() -> None:
    for kind, names in ENTITY_NAMES.items():
        assert {kind, "entity", "demand"} <= names
    assert "gpu" not in ENTITY_NAMES["node"] and "gpus" in ENTITY_NAMES["node"]
    assert TIME_HELPERS < {"duration", "is_weekend", "is_workday", "is_holiday", "in_window", "range"}


def test_jinja_names_give_now_in_the_zone_and_helpers_on_that_day() -> None:
    # Monday 01:00 UTC is still Sunday in New York (a weekend day) and Monday in Tokyo.
    monday = datetime(2026, 1, 5, 1, 0, tzinfo=UTC)
    ctx = {"gpu": {"idle": True}, CLOCK_KEY: EvalClock(monday)}
    ny = jinja_names(ctx, ZoneInfo("America/New_York"))
    tokyo = jinja_names(ctx, ZoneInfo("Asia/Tokyo"))
    assert CLOCK_KEY not in ny and ny["gpu"] == {"idle": True}
    assert ny["now"].day == 4 and tokyo["now"].day == 5
    assert ny["is_weekend"]() is True and tokyo["is_weekend"]() is False
    assert ny["duration"]("1h30m") == 5400.0
