"""One registry for every action type: built-in specs register on import, plugins through entry points;
an action's runtime (its `run`, and the clients it needs) is imported only when the action first runs."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any, TypeVar

from pydantic import ValidationError

from actions.escaping import argv_element
from actions.legacy import adapt
from actions.protocol import UNITS, Action, ActionParams

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "gpuevents.actions"
#: the light half of each built-in (parameters and what it is); each names its runtime in `actions.builtin`
BUILTIN_MODULES: tuple[str, ...] = (
    "actions.specs.log",
    "actions.specs.slack",
    "actions.specs.kill",
    "actions.specs.cordon",
    "actions.specs.scale",
    "actions.specs.webhook",
    "actions.specs.command",
    "actions.specs.publish",
    "actions.specs.function",
    "actions.specs.report",
    "actions.specs.email",
    "actions.specs.notify",
    "actions.specs.cancel",
    "actions.specs.pause",
    "actions.specs.drain",
    "actions.specs.keep",
    "actions.specs.power_cap",
    "actions.specs.diagnose",
)

AnyAction = Action[Any]
_registry: dict[str, type[AnyAction]] = {}
_runtimes: dict[str, type[AnyAction]] = {}
_loaded = False

A = TypeVar("A", bound=type[Any])


class UnknownActionError(KeyError):
    def __init__(self, type_: str) -> None:
        super().__init__(type_)
        self.type = type_

    def __str__(self) -> str:
        known = ", ".join(sorted(_registry)) or "none"
        return f"unknown action type {self.type!r}; known types: {known}"


def register(cls: A) -> A:
    """Class decorator: make `cls` (an `Action` subclass) the action for `cls.type`. A class of the earlier
    protocol is wrapped (actions/legacy.py), with a DeprecationWarning."""
    if not isinstance(cls, type):
        raise TypeError(f"{cls!r} is not a class")
    _add(cls if issubclass(cls, Action) else adapt(cls))
    return cls


def _add(cls: type[AnyAction]) -> None:
    type_ = getattr(cls, "type", None)  # a subclass that forgot it has none
    if not isinstance(type_, str) or not type_:
        raise TypeError(f"{cls.__name__} needs a non-empty `type`")
    params = getattr(cls, "params", None)
    if not (isinstance(params, type) and issubclass(params, ActionParams)):
        raise TypeError(f"{cls.__name__}.params must be an ActionParams subclass")
    if cls.unit not in UNITS:
        raise TypeError(f"{cls.__name__}.unit must be one of {', '.join(sorted(UNITS))}")
    previous = _registry.get(type_)
    if previous is not None and previous is not cls:
        raise ValueError(f"action type {type_!r} is registered twice ({previous.__name__}, {cls.__name__})")
    _registry[type_] = cls


def load() -> None:
    """Import the built-in specs and every plugin of the entry-point group, once."""
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
        if not isinstance(obj, type) or obj in _registry.values():
            continue
        try:
            _add(obj if issubclass(obj, Action) else adapt(obj))
        except (TypeError, ValueError) as e:
            log.error("action plugin %s (%s) is not an action: %s", ep.name, ep.value, e)


def get(type_: str) -> type[AnyAction]:
    """The action's class as registered: its parameters and nature, enough to check a rule (never its runtime)."""
    load()
    try:
        return _registry[type_]
    except KeyError:
        raise UnknownActionError(type_) from None


def runtime(type_: str) -> type[AnyAction]:
    """The class that runs `type_`: the registered class, or the subclass its `runtime` names (imported now)."""
    found = _runtimes.get(type_)
    if found is not None:
        return found
    spec = get(type_)
    if spec.runtime is None:
        found = spec
    else:
        module, _, name = spec.runtime.partition(":")
        found = getattr(importlib.import_module(module), name)
        if not (isinstance(found, type) and issubclass(found, spec)):
            raise TypeError(f"the runtime of action {type_!r}, {spec.runtime}, is not a subclass of {spec.__name__}")
    _runtimes[type_] = found
    return found


def types() -> list[str]:
    load()
    return sorted(_registry)


def restores(type_: str, params: Mapping[str, Any]) -> bool:
    """Whether this action, with these rendered parameters, restores what a firing did (never limited)."""
    return get(type_).restores(params)


EscapeAt = Callable[[tuple[str | int, ...]], Callable[[str], str]]


def escape_for(type_: str) -> EscapeAt:
    """How values from the machine are escaped when rendered into each of this action's parameters (by path).

    An `argv` parameter is an argv whatever the action (`command`, `cordon`/`scale`/`cancel` with `provider:
    command`, a plugin's): a value from the machine there is checked here, once, by `argv_element`."""
    cls = get(type_)

    def escape_at(path: tuple[str | int, ...]) -> Callable[[str], str]:
        if path and path[0] == "argv":
            return argv_element
        return cls.escape_at(path)

    return escape_at


def readable(type_: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters as people read them (rule tests, replays, the audit): the action's own `readable(params)` where
    it keeps more than it shows (notify's marks around values from the machine), else as they are."""
    load()
    cls = _registry.get(type_)
    return cls.readable(params) if cls is not None else dict(params)


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
