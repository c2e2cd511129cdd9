"""A plugin written against the earlier protocol (a plain class, `run(ctx)`, hooks found by name) still loads
through its entry point, keeps its declared nature and runs through the runner, with a DeprecationWarning."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from actions import registry
from actions.legacy import LegacyAction, adapt
from actions.runner import ActionRunner
from tests.actions.conftest import make_config, make_request

PLUGIN = '''
"""A plugin of the earlier protocol, as third parties wrote them."""
from typing import ClassVar, Literal

from actions.protocol import ActionContext, ActionParams, ActionResult
from actions.services import services_of


class OldParams(ActionParams):
    type: Literal["legacy.mark"] = "legacy.mark"
    name: str
    undo: bool = False
    timeout: float | None = None


class OldAction:
    type: ClassVar[str] = "legacy.mark"
    params = OldParams
    entity_kinds = frozenset({"node"})
    destructive: ClassVar[bool] = True
    unit: ClassVar[str] = "node"
    escape = staticmethod(lambda value: value.upper())

    def __init__(self) -> None:
        self.runs = 0

    @staticmethod
    def escape_at(path):
        return (lambda value: "<" + value + ">") if path == ("name",) else str.upper

    @staticmethod
    def restores(params):
        return bool(params.get("undo"))

    def run_timeout(self, params, default):
        return 42.0

    async def run(self, ctx: ActionContext) -> ActionResult:
        p = ctx.params
        assert isinstance(p, OldParams)
        self.runs += 1
        kv = services_of(ctx).kv
        await kv.put("legacy.mark", p.name.encode())
        got = await kv.get("legacy.mark")
        return ActionResult(detail=f"marked {got.value.decode()} (run {self.runs})")
'''


@pytest.fixture
def legacy_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The plugin installed for real: a module and its dist-info with the entry point, on sys.path; the registry
    loads again from scratch and is put back afterwards."""
    (tmp_path / "old_plugin.py").write_text(textwrap.dedent(PLUGIN))
    info = tmp_path / "old_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: old-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\nlegacy.mark = old_plugin:OldAction\n")
    registry.load()  # the built-ins register when first imported: keep them
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))
    monkeypatch.setattr(registry, "_runtimes", dict(registry._runtimes))
    monkeypatch.setattr(registry, "_loaded", False)
    yield
    import sys

    sys.modules.pop("old_plugin", None)


def test_an_earlier_protocol_plugin_is_wrapped_with_its_declared_nature(legacy_plugin: None) -> None:
    with pytest.warns(DeprecationWarning, match="old_plugin.OldAction uses the earlier action protocol"):
        cls = registry.get("legacy.mark")
    assert issubclass(cls, LegacyAction) and cls.legacy.__name__ == "OldAction"
    assert (cls.destructive, cls.unit, cls.entity_kinds) == (True, "node", frozenset({"node"}))
    assert registry.restores("legacy.mark", {"name": "x", "undo": True})
    assert not registry.restores("legacy.mark", {"name": "x"})
    escape_at = registry.escape_for("legacy.mark")
    assert (escape_at(("name",))("a"), escape_at(("other",))("a")) == ("<a>", "A")
    assert "slack" in registry.types()  # the built-ins load beside it


async def test_an_earlier_protocol_plugin_runs_through_the_runner(legacy_plugin: None) -> None:
    with pytest.warns(DeprecationWarning):
        registry.load()
    runner = await ActionRunner.open(None, make_config())
    instance = runner._instance("legacy.mark")
    assert instance.run_timeout(registry.parse_params("legacy.mark", {"name": "n1"}), 5.0) == 42.0
    first = await runner.process(make_request("legacy.mark", {"name": "n1"}, entity_kind="node", entity_id="n1"))
    second = await runner.process(make_request("legacy.mark", {"name": "n2"}, entity_kind="node", entity_id="n1"))
    assert (first.outcome, first.detail) == ("ok", "marked n1 (run 1)")
    assert (second.outcome, second.detail) == ("ok", "marked n2 (run 2)")  # one instance per runner
    refused = await runner.process(make_request("legacy.mark", {"name": "n1"}))  # a gpu: not its kind
    assert refused.outcome == "refused" and refused.error == "legacy.mark acts on node, not on a gpu"


def test_a_class_that_is_no_action_at_all_is_refused() -> None:
    class NoParams:
        type = "legacy.none"

    with pytest.raises(TypeError, match=r"NoParams\.params must be an ActionParams subclass"):
        adapt(NoParams)
