"""What compiled conditions call while they run: the sandbox's lookups and the common filters, unrolled.

Each does what Jinja2's generated code would do for the same node (the sandbox's `getattr`/`getitem`,
`select_or_reject`, `sync_do_map`), minus the per-call runtime; the compiler binds them into the
namespace of every compiled condition.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jinja2 import StrictUndefined, Undefined
from jinja2.runtime import new_context
from jinja2.sandbox import SandboxedEnvironment

from rules.lang.expr.names import CONDITION_ENV
from rules.lang.views import FIELDS_OF, EntityView, GpuView, NodeView, ProcessView

_VIEW_FIELDS: dict[type, frozenset[str]] = {
    GpuView: FIELDS_OF["gpu"], ProcessView: FIELDS_OF["process"], NodeView: FIELDS_OF["node"],
    EntityView: FIELDS_OF["entity"],
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
