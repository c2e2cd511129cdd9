"""One registry for every action type: built-ins register on import, plugins through entry points."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, TypeVar

from pydantic import ValidationError

from actions.escaping import argv_element
from actions.protocol import UNITS, Action, ActionParams

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "gpuevents.actions"
BUILTIN_MODULES: tuple[str, ...] = (
    "actions.builtin.log",
    "actions.builtin.slack",
    "actions.builtin.kill",
    "actions.builtin.cordon",
    "actions.builtin.scale",
    "actions.builtin.webhook",
    "actions.builtin.command",
    "actions.builtin.publish",
    "actions.builtin.function",
    "actions.builtin.report",
    "actions.builtin.email",
    "actions.builtin.notify",
    "actions.builtin.cancel",
    "actions.builtin.pause",
    "actions.builtin.drain",
    "actions.builtin.keep",
)

_registry: dict[str, type[Any]] = {}
_loaded = False

A = TypeVar("A")


class UnknownActionError(KeyError):
    def __init__(self, type_: str) -> None:
        super().__init__(type_)
        self.type = type_

    def __str__(self) -> str:
        known = ", ".join(sorted(_registry)) or "none"
        return f"unknown action type {self.type!r}; known types: {known}"


def register(cls: type[A]) -> type[A]:
    """Class decorator: make `cls` the action for `cls.type`."""
    type_ = getattr(cls, "type", None)
    if not isinstance(type_, str) or not type_:
        raise TypeError(f"{cls.__name__} needs a non-empty `type`")
    params = getattr(cls, "params", None)
    if not (isinstance(params, type) and issubclass(params, ActionParams)):
        raise TypeError(f"{cls.__name__}.params must be an ActionParams subclass")
    if getattr(cls, "unit", "entity") not in UNITS:
        raise TypeError(f"{cls.__name__}.unit must be one of {', '.join(sorted(UNITS))}")
    previous = _registry.get(type_)
    if previous is not None and previous is not cls:
        raise ValueError(f"action type {type_!r} is registered twice ({previous.__name__}, {cls.__name__})")
    _registry[type_] = cls
    return cls


def load() -> None:
    """Import the built-ins and every plugin of the entry-point group, once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as e:
            log.error("action plugin %s (%s) failed to load: %s", ep.name, ep.value, e)
            continue
        if isinstance(obj, type) and obj not in _registry.values():
            register(obj)


def get(type_: str) -> type[Action]:
    load()
    try:
        return _registry[type_]
    except KeyError:
        raise UnknownActionError(type_) from None


def types() -> list[str]:
    load()
    return sorted(_registry)


def restores(type_: str, params: Mapping[str, Any]) -> bool:
    """Whether this action, with these rendered parameters, restores what a firing did (never limited)."""
    check = getattr(get(type_), "restores", None)
    return bool(check(params)) if callable(check) else False


EscapeAt = Callable[[tuple[str | int, ...]], Callable[[str], str]]


def escape_for(type_: str) -> EscapeAt:
    """How values from the machine are escaped when rendered into each of this action's parameters (by path).

    An `argv` parameter is an argv whatever the action (`command`, `cordon`/`scale`/`cancel` with `provider:
    command`, a plugin's): a value from the machine there is checked here, once, by `argv_element`."""
    cls = get(type_)
    at = getattr(cls, "escape_at", None)
    escape: Callable[[str], str] = cls.escape

    def escape_at(path: tuple[str | int, ...]) -> Callable[[str], str]:
        if path and path[0] == "argv":
            return argv_element
        return at(path) if callable(at) else escape

    return escape_at


def readable(type_: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters as people read them (rule tests, replays, the audit): the action's own `readable(params)` where
    it keeps more than it shows (notify's marks around values from the machine), else as they are."""
    load()
    show = getattr(_registry.get(type_), "readable", None)
    return dict(show(params)) if callable(show) else dict(params)


class ParamsError(ValueError):
    """Parameters that do not fit the action's model; `problems` are (location, message) pairs."""

    def __init__(self, type_: str, problems: list[tuple[str, str]]) -> None:
        self.type = type_
        self.problems = problems
        super().__init__("; ".join(f"{loc}: {msg}" if loc else msg for loc, msg in problems))


def _problems(e: ValidationError, skip: int = 0) -> list[tuple[str, str]]:
    out = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"][skip:])
        out.append((loc, err["msg"]))
    return out


def parse_params(type_: str, params: Mapping[str, Any]) -> ActionParams:
    """Validate rendered parameters with the model of `type_` (ParamsError names each bad key)."""
    cls = get(type_)
    data = {k: v for k, v in params.items() if k != "type"}
    try:
        return cls.params.model_validate({"type": type_, **data})
    except ValidationError as e:
        raise ParamsError(type_, _problems(e)) from None
