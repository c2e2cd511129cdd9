"""The action base: a subclass that declares only `type`, `params` and `run` gets the harmless defaults, and
each hook is a method it overrides; the context hands it typed services."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

import pytest

from actions.protocol import ALL_KINDS, Action, ActionContext, ActionParams, ActionResult
from actions.services import Services, services_of
from tests.actions.conftest import make_config, make_request


class _Params(ActionParams):
    type: Literal["base-test"] = "base-test"
    timeout: float | None = None
    where: str = ""


class _Bare(Action[_Params]):
    type: ClassVar[str] = "base-test"
    params = _Params


class _Own(_Bare):
    destructive: ClassVar[bool] = True

    @classmethod
    def escape_at(cls, path: tuple[str | int, ...]) -> Callable[[str], str]:
        return str.upper if path == ("where",) else cls.escape

    @classmethod
    def restores(cls, params: Mapping[str, Any]) -> bool:
        return True

    def run_timeout(self, params: _Params, default: float) -> float:
        return 99.0

    async def run(self, params: _Params, ctx: ActionContext) -> ActionResult:
        return ActionResult(detail=f"{params.where} with {type(ctx.services).__name__}")


def test_the_defaults_are_the_harmless_ones() -> None:
    assert (_Bare.entity_kinds, _Bare.destructive, _Bare.unit, _Bare.runtime) == (ALL_KINDS, False, "entity", None)
    assert _Bare.escape("<@U1> & *x*") == "<@U1> & *x*"  # values land as they are unless the action says
    assert _Bare.escape_at(("where",)) is _Bare.escape
    assert not _Bare.restores({"where": "x"})
    assert _Bare.readable({"where": "x"}) == {"where": "x"}


def test_the_time_limit_is_a_timeout_parameter_else_the_default() -> None:
    bare = _Bare()
    assert bare.run_timeout(_Params(timeout=12.5), 5.0) == 12.5
    assert bare.run_timeout(_Params(), 5.0) == 5.0
    assert bare.run_timeout(_Params(timeout=0), 5.0) == 5.0


def test_hooks_are_methods_a_subclass_overrides() -> None:
    assert _Own.destructive and _Own.restores({})
    assert _Own.escape_at(("where",))("n1") == "N1"
    assert _Own().run_timeout(_Params(timeout=1), 5.0) == 99.0


async def test_run_gets_typed_params_and_the_context_its_services() -> None:
    config = make_config()
    ctx = ActionContext(request=make_request("base-test", {"where": "n1"}), params=_Params(where="n1"), config=config)
    assert isinstance(ctx.services, Services) and ctx.services.config is config  # a private set outside a runner
    assert services_of(ctx) is ctx.services  # what plugins of the earlier protocol call
    result = await _Own().run(_Params(where="n1"), ctx)
    assert result.detail == "n1 with Services"


async def test_an_action_without_run_says_so() -> None:
    ctx = ActionContext(request=make_request("base-test"), params=_Params(), config=make_config())
    with pytest.raises(NotImplementedError, match="action base-test has no run"):
        await _Bare().run(_Params(), ctx)
