"""What a condition may use: the names in scope, helpers, filters, tests and methods, and Jinja2's parse.

The allow-list is the language: anything not named here is a load error with its location. The same
names as Jinja2 sees them (`jinja_names`) let templates and the sandboxed `compile_expression` agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import tzinfo
from typing import Any

from jinja2 import StrictUndefined, TemplateSyntaxError, nodes
from jinja2.parser import Parser
from jinja2.sandbox import SandboxedEnvironment

from gpuevents.durations import parse_duration
from rules.lang import calendars
from rules.lang.views import EvalClock

CLOCK_KEY = "$clock"
"""Where a context dict holds its EvalClock."""

CONDITION_ENV = SandboxedEnvironment(undefined=StrictUndefined)
"""Jinja2's sandbox as conditions are defined by: it parses them, and compiled conditions equal its results."""

ENTITY_NAMES: dict[str, frozenset[str]] = {
    "gpu": frozenset({"gpu", "node", "entity", "demand"}),
    "process": frozenset({"process", "node", "gpus", "entity", "demand"}),
    "node": frozenset({"node", "gpus", "entity", "demand"}),
    "job": frozenset({"job", "gpus", "entity", "demand"}),
}
HELPERS = frozenset({"duration", "is_weekend", "is_workday", "is_holiday", "in_window", "range"})
TIME_HELPERS = frozenset({"is_weekend", "is_workday", "is_holiday", "in_window"})

FILTERS = frozenset({
    "abs", "attr", "capitalize", "count", "d", "default", "first", "float", "groupby", "int", "join", "last",
    "length", "list", "lower", "map", "max", "min", "reject", "rejectattr", "replace", "reverse", "round",
    "select", "selectattr", "sort", "string", "sum", "title", "trim", "truncate", "unique", "upper",
    "wordcount",
})
TESTS = frozenset({
    "boolean", "defined", "divisibleby", "eq", "equalto", "even", "false", "float", "ge", "gt",
    "greaterthan", "in", "integer", "iterable", "le", "lower", "lt", "lessthan", "mapping", "ne", "none",
    "number", "odd", "sameas", "sequence", "string", "true", "undefined", "upper",
})
METHODS = frozenset({
    "startswith", "endswith", "lower", "upper", "strip", "lstrip", "rstrip", "split", "rsplit", "replace",
    "count", "find", "rfind", "title", "capitalize", "isdigit", "isalpha", "isalnum", "get", "keys", "values",
    "items", "weekday", "isoweekday", "date", "time", "isoformat", "timestamp",
})
MAX_SOURCE_CHARS = 10_000
"""A condition is a line or two of YAML: anything much longer is a mistake (or an attack on the engine)."""
MAX_DEPTH = 40
"""How deeply a condition may nest (parentheses, filters, operators); long `and`/`or` chains are flat."""
UNSAFE_ATTRS = frozenset({"mro", "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_code", "ag_frame", "format",
                          "format_map"})


class ExprError(ValueError):
    """An expression that does not compile; `line` is 1-based within the expression."""

    def __init__(self, message: str, line: int = 1) -> None:
        super().__init__(message)
        self.line = line


def parse_expression(source: str) -> nodes.Expr:
    """Jinja2's own parse of one expression (what `compile_expression` does)."""
    if len(source) > MAX_SOURCE_CHARS:
        raise ExprError(f"the condition is {len(source)} characters long; at most {MAX_SOURCE_CHARS}: split it "
                        f"into simpler rules")
    try:
        parser = Parser(CONDITION_ENV, source, state="variable")
        expr = parser.parse_expression()
        if not parser.stream.eos:
            tok = parser.stream.current
            raise TemplateSyntaxError(f"unexpected {tok.value!r} after the expression", tok.lineno, None, None)
    except TemplateSyntaxError as e:
        raise ExprError(f"syntax error: {e.message}", e.lineno) from None
    except RecursionError:
        raise ExprError(f"the condition nests too deeply; at most {MAX_DEPTH} levels") from None
    return expr


def jinja_names(ctx: Mapping[str, Any], tz: tzinfo) -> dict[str, Any]:
    """The same context as Jinja2 names (with helpers as callables), for `compile_expression` and templates."""
    clock: EvalClock = ctx[CLOCK_KEY]
    out = {k: v for k, v in ctx.items() if k != CLOCK_KEY}
    day = clock.local(tz).date()
    out.update(
        now=clock.local(tz),
        duration=parse_duration,
        is_weekend=lambda: day.weekday() >= 5,
        is_workday=lambda country: calendars.is_workday(country, day),
        is_holiday=lambda country: calendars.is_holiday(country, day),
        in_window=lambda spec: calendars.in_window(spec, clock.utc, tz),
    )
    return out
