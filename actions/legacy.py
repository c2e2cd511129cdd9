"""The shim for plugins written against the earlier action protocol: a plain class, `run(ctx)`, optional hooks.

Such a class (ClassVars `type`, `params`, maybe `entity_kinds`, `destructive`, `unit`, `escape`, and methods
`escape_at`, `restores`, `readable`, `run_timeout` found by name) is wrapped once, when its entry point loads, in an
`Action` subclass that calls it; it runs, is checked and audited as before. New plugins subclass `Action`.
"""

from __future__ import annotations

import builtins
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from actions.protocol import ALL_KINDS, Action, ActionContext, ActionParams, ActionResult
from gpuevents.records import ActionUnit, EntityKind


class LegacyAction(Action[ActionParams]):
    """An earlier-protocol plugin class behind the `Action` base; `legacy` is that class."""

    legacy: ClassVar[builtins.type[Any]]

    def __init__(self) -> None:
        self._inner: Any = self.legacy()

    def run_timeout(self, params: ActionParams, default: float) -> float:
        custom = getattr(self._inner, "run_timeout", None)
        return float(custom(params, default)) if callable(custom) else super().run_timeout(params, default)

    async def run(self, params: ActionParams, ctx: ActionContext) -> ActionResult:
        result: ActionResult = await self._inner.run(ctx)  # ctx.params is `params`
        return result


def adapt(legacy: builtins.type[Any]) -> builtins.type[Action[ActionParams]]:
    """An `Action` subclass that runs `legacy`, a class of the earlier protocol, with its declared nature."""
    params = getattr(legacy, "params", None)
    if not (isinstance(params, type) and issubclass(params, ActionParams)):
        raise TypeError(f"{legacy.__name__}.params must be an ActionParams subclass")
    warnings.warn(f"action plugin {legacy.__module__}.{legacy.__name__} uses the earlier action protocol; "
                  "subclass actions.protocol.Action instead (docs/actions.md, Writing a plugin)",
                  DeprecationWarning, stacklevel=2)
    escape: Callable[[str], str] = getattr(legacy, "escape", Action.escape)
    escape_at = getattr(legacy, "escape_at", None)
    restores = getattr(legacy, "restores", None)
    readable = getattr(legacy, "readable", None)
    kinds: frozenset[EntityKind] = getattr(legacy, "entity_kinds", ALL_KINDS)
    unit: ActionUnit = getattr(legacy, "unit", "entity")

    class Adapted(LegacyAction):
        @staticmethod
        def escape(value: str) -> str:
            return escape(value)

        @classmethod
        def escape_at(cls, path: tuple[str | int, ...]) -> Callable[[str], str]:
            return escape_at(path) if callable(escape_at) else escape

        @classmethod
        def restores(cls, params: Mapping[str, Any]) -> bool:
            return bool(restores(params)) if callable(restores) else False

        @classmethod
        def readable(cls, params: Mapping[str, Any]) -> dict[str, Any]:
            return dict(readable(params)) if callable(readable) else dict(params)

    Adapted.legacy = legacy
    Adapted.type = getattr(legacy, "type", "")
    Adapted.params = params
    Adapted.entity_kinds = kinds
    Adapted.destructive = bool(getattr(legacy, "destructive", False))
    Adapted.unit = unit
    Adapted.__name__ = Adapted.__qualname__ = f"{legacy.__name__}(legacy)"
    Adapted.__module__ = legacy.__module__
    return Adapted
