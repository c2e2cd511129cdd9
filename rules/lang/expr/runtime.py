"""What compiled conditions call while they run: the sandbox's lookups and the common filters, unrolled.

Each does what Jinja2's generated code would do for the same node (the sandbox's `getattr`/`getitem`,
`select_or_reject`, `sync_do_map`), minus the per-call runtime; the compiler binds them into the
namespace of every compiled condition.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from jinja2 import StrictUndefined, Undefined
from jinja2.runtime import new_context
from jinja2.sandbox import SandboxedEnvironment

from rules.lang.expr.names import CONDITION_ENV
from rules.lang.views import FIELDS_OF, DemandView, EntityView, GpuView, JobView, NodeView, ProcessView

_VIEW_FIELDS: dict[type, frozenset[str]] = {
    GpuView: FIELDS_OF["gpu"], ProcessView: FIELDS_OF["process"], NodeView: FIELDS_OF["node"],
    EntityView: FIELDS_OF["entity"], JobView: FIELDS_OF["job"], DemandView: FIELDS_OF["demand"],
}
_MISS = object()
DICT_ATTRS = frozenset(dir(dict))
"""Names a dict has as attributes (`items`, `keys`): `labels.items` must find the method, as Jinja2 does."""


class _ConditionEnv(SandboxedEnvironment):
    """The sandbox with a shortcut for a view's public field, which it would reach the long way.

    The sandbox's `getitem(view, "idle")` tries `view["idle"]` (a TypeError: views are not subscriptable),
    then `getattr`, then checks that the value is safe: a public field of a plain object always is. The
    shortcut returns the same value without raising and catching that TypeError (filters like `selectattr`
    and `map(attribute=)` look every item up this way)."""

    def getitem(self, obj: Any, argument: Any) -> Any:
        fields = _VIEW_FIELDS.get(type(obj))
        if fields is not None and type(argument) is str and argument in fields:
            try:
                return getattr(obj, argument)
            except AttributeError:
                pass
        return super().getitem(obj, argument)


FAST_ENV = _ConditionEnv(undefined=StrictUndefined)
"""The environment compiled conditions run in: its filters, tests and `getitem`."""
JINJA_CONTEXT = new_context(FAST_ENV, None, {})
"""The context handed to filters and tests that ask for one."""


def sandbox_getattr(obj: Any, name: str) -> Any:
    """The sandbox's getattr: the attribute, else the item, else undefined."""
    try:
        return getattr(obj, name)
    except AttributeError:
        pass
    try:
        return obj[name]
    except (TypeError, LookupError):
        return CONDITION_ENV.undefined(obj=obj, name=name)


def getattr_mapping(obj: Any, name: str) -> Any:
    """`sandbox_getattr` with a fast path for a dict and a name that is no dict attribute (`labels.env`)."""
    if type(obj) is dict:
        value = obj.get(name, _MISS)
        return value if value is not _MISS else CONDITION_ENV.undefined(obj=obj, name=name)
    return sandbox_getattr(obj, name)


def undefined_to_none(value: Any) -> Any:
    return None if isinstance(value, Undefined) else value


def str_join(seq: tuple[Any, ...]) -> str:
    """`a ~ b` (Jinja2's concatenation), bounded (see `deep_size`)."""
    _bounded_input(seq, "a concatenation")
    return "".join(map(str, seq))


def select_attr(value: Any, attr: str, keep: bool) -> Iterator[Any]:
    """`selectattr(attr)` (keep) / `rejectattr(attr)`: Jinja2's `select_or_reject` with no test, unrolled."""
    if value:
        get = FAST_ENV.getitem
        for item in value:
            if bool(get(item, attr)) is keep:
                yield item


def select(value: Any, keep: bool) -> Iterator[Any]:
    """`select` (keep) / `reject` with no test: Jinja2's `select_or_reject`, unrolled."""
    if value:
        for item in value:
            if bool(item) is keep:
                yield item


def map_attr(value: Any, attr: str) -> Iterator[Any]:
    """`map(attribute=attr)`: Jinja2's `sync_do_map` with an attribute and no default, unrolled."""
    if value:
        get = FAST_ENV.getitem
        for item in value:
            yield get(item, attr)


# ---------------------------------------------------------------- bounded arithmetic and sizes
MAX_SIZE = 100_000
"""The longest string or sequence an evaluation may build (Jinja2's own `range` limit): beyond it the
evaluation fails (false, counted), rather than taking the engine's memory or time."""
MAX_INT_BITS = 4_096


class EvalLimitError(ArithmeticError):
    """An evaluation would build a value too large to be a reasonable condition."""


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str | list | tuple | bytes) else 0


def _check(value: Any) -> Any:
    if isinstance(value, str | list | tuple) and len(value) > MAX_SIZE:
        raise EvalLimitError(f"a value of {len(value)} items or characters: conditions stop at {MAX_SIZE}")
    if type(value) is int and value.bit_length() > MAX_INT_BITS:
        raise EvalLimitError(f"an integer of {value.bit_length()} bits: conditions stop at {MAX_INT_BITS}")
    return value


def _seconds(value: Any) -> timedelta | None:
    """A number read as seconds next to a datetime (`now - duration('1d')`); None for anything else."""
    if type(value) in (int, float):
        return timedelta(seconds=value)
    return None


def add(a: Any, b: Any) -> Any:
    """`a + b`, where a datetime plus a number of seconds is a datetime, and sizes are bounded."""
    if isinstance(a, datetime) and (d := _seconds(b)) is not None:
        return a + d
    if isinstance(b, datetime) and (d := _seconds(a)) is not None:
        return b + d
    if _size(a) + _size(b) > MAX_SIZE:
        raise EvalLimitError(f"a value of {_size(a) + _size(b)} items or characters: conditions stop at {MAX_SIZE}")
    return _check(a + b)


def sub(a: Any, b: Any) -> Any:
    """`a - b`, where a datetime minus a number of seconds is a datetime (`now - duration('5m')`)."""
    if isinstance(a, datetime) and (d := _seconds(b)) is not None:
        return a - d
    return a - b


def mul(a: Any, b: Any) -> Any:
    """`a * b` with repetition (`'a' * n`, `list * n`) and integer growth bounded."""
    for seq, n in ((a, b), (b, a)):
        if isinstance(seq, str | list | tuple) and type(n) in (int, bool) and len(seq) * n > MAX_SIZE:
            raise EvalLimitError(f"repeating {len(seq)} items {n} times: conditions stop at {MAX_SIZE}")
    if type(a) is int and type(b) is int and a.bit_length() + b.bit_length() > MAX_INT_BITS:
        raise EvalLimitError(f"an integer product over {MAX_INT_BITS} bits")
    return a * b


def power(a: Any, b: Any) -> Any:
    """`a ** b` with integer growth bounded (`2 ** (10 ** 10)` must not stall the engine)."""
    if type(a) is int and type(b) is int and b > 0 and abs(a) > 1 and max(a.bit_length(), 1) * b > MAX_INT_BITS:
        raise EvalLimitError(f"{a} ** {b} is over {MAX_INT_BITS} bits")
    return _check(a**b)


_FORMAT_WIDTH = re.compile(r"%[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")


def mod(a: Any, b: Any) -> Any:
    """`a % b`; printf-style formatting with a huge width or precision is refused, not built."""
    if isinstance(a, str):
        _bounded_input(b, "a format argument")
        for width, precision in _FORMAT_WIDTH.findall(a):
            if "*" in (width, precision) or max(int(width or 0), int(precision or 0)) > MAX_SIZE:
                raise EvalLimitError("a format width or precision over the limit of conditions")
        return _check(a % b)
    return a % b


def safe_range(*args: Any) -> range:
    """`range(...)`, at most MAX_SIZE long (as Jinja2's sandbox)."""
    r = range(*args)
    if len(r) > MAX_SIZE:
        raise EvalLimitError(f"a range of {len(r)} items: conditions stop at {MAX_SIZE}")
    return r


def call_method(obj: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    """A string/dict/datetime method from the allow-list; what it builds is bounded."""
    if name == "replace" and isinstance(obj, str) and len(args) >= 2 and isinstance(args[1], str):
        count = obj.count(args[0]) if isinstance(args[0], str) and args[0] else len(obj) + 1
        if len(obj) + count * len(args[1]) > MAX_SIZE:
            raise EvalLimitError(f"a replacement over {MAX_SIZE} characters")
    return _check(sandbox_getattr(obj, name)(*args, **kwargs))


def bounded_filter(func: Any) -> Any:
    """Wrap a filter so that what it returns is size-checked (a string `replace`, `join`, `list`...)."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return _check(func(*args, **kwargs))

    wrapped.__dict__["__wrapped__"] = func
    for attr in ("jinja_pass_arg",):
        if hasattr(func, attr):
            setattr(wrapped, attr, getattr(func, attr))
    return wrapped


def deep_size(value: Any, limit: int = MAX_SIZE) -> int:
    """Characters and items in `value`, counted until `limit` is passed (what `str(value)` or a join builds)."""
    total = 0
    stack = [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, str | bytes):
            total += len(v)
        elif isinstance(v, list | tuple | set | frozenset):
            total += len(v)
            stack.extend(v)
        elif isinstance(v, dict):
            total += len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        else:
            total += 1
    return total


def _bounded_input(value: Any, what: str) -> None:
    if deep_size(value) > MAX_SIZE:
        raise EvalLimitError(f"{what} of over {MAX_SIZE} characters: conditions stop there")


def string_filter(value: Any) -> str:
    _bounded_input(value, "a string")
    return str(value)


def join_filter(value: Any, d: str = "", attribute: str | int | None = None) -> str:
    items = list(value)
    if attribute is not None:
        get = FAST_ENV.getitem
        items = [get(x, attribute) for x in items]
    sep = str(d)
    if deep_size(items) + len(sep) * len(items) > MAX_SIZE:
        raise EvalLimitError(f"a join of over {MAX_SIZE} characters: conditions stop there")
    return sep.join(map(str, items))


def replace_filter(s: Any, old: str, new: str, count: int | None = None) -> str:
    replaced: str = call_method(str(s), "replace", old, new, -1 if count is None else count)
    return replaced


def sum_filter(iterable: Any, attribute: str | int | None = None, start: Any = 0) -> Any:
    """`sum`, of numbers only (summing lists or strings grows quadratically)."""
    items = list(iterable)
    if attribute is not None:
        get = FAST_ENV.getitem
        items = [get(x, attribute) for x in items]
    if not all(type(x) in (int, float, bool) for x in [*items, start]):
        raise TypeError("sum adds numbers in conditions")
    return _check(sum(items, start))
