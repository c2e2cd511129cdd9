"""Conditions: Jinja2 expression syntax, parsed once by Jinja2 and compiled to one Python function.

`names` is the allow-list (what a condition may name, call and filter with) and Jinja2's parse,
`compiler` turns a checked tree into Python, and `runtime` holds what the compiled code calls.
"""

from rules.lang.expr.compiler import Condition, compile_condition
from rules.lang.expr.names import (
    CLOCK_KEY,
    CONDITION_ENV,
    ENTITY_NAMES,
    FILTERS,
    HELPERS,
    METHODS,
    TESTS,
    TIME_HELPERS,
    ExprError,
    jinja_names,
    parse_expression,
)

__all__ = [
    "CLOCK_KEY",
    "CONDITION_ENV",
    "ENTITY_NAMES",
    "FILTERS",
    "HELPERS",
    "METHODS",
    "TESTS",
    "TIME_HELPERS",
    "Condition",
    "ExprError",
    "compile_condition",
    "jinja_names",
    "parse_expression",
]
