"""Plugins come through the same door as built-ins: the example plugin, found by its entry point, runs."""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path
from typing import ClassVar

import pytest

from actions import registry
from actions.legacy import LegacyAction
from actions.protocol import ALL_KINDS, Action, ActionParams
from actions.runner import ActionRunner
from tests.actions.conftest import make_config, make_request

INSTALL_HINT = "pip install -e examples/gpuevents-example-plugin (.ci/run installs every examples/* plugin)"


def test_the_example_plugin_is_registered_through_its_entry_point() -> None:
    eps = [ep for ep in entry_points(group=registry.ENTRY_POINT_GROUP) if ep.name == "example.jsonl"]
    assert eps, f"the example plugin is not installed: {INSTALL_HINT}"
    assert registry.get("example.jsonl") is eps[0].load()
    assert "example.jsonl" in registry.types() and "slack" in registry.types()


def test_plugin_parameters_are_checked_by_the_plugins_own_model() -> None:
    params = registry.parse_params("example.jsonl", {"path": "/tmp/x.jsonl"})
    assert type(params).__name__ == "JsonLinesParams"
    with pytest.raises(registry.ParamsError) as caught:
        registry.parse_params("example.jsonl", {})
    assert [loc for loc, _ in caught.value.problems] == ["path"]


def test_a_unit_that_is_neither_entity_nor_node_is_refused_at_registration() -> None:
    class Odd(Action[ActionParams]):
        type: ClassVar[str] = "odd-unit-test"
        params = ActionParams
        unit = "gpu"  # type: ignore[assignment]  # not an ActionUnit: that is the point

    with pytest.raises(TypeError, match="unit must be one of entity, node"):
        registry.register(Odd)
    assert "odd-unit-test" not in registry.types()


def test_register_wraps_a_class_of_the_earlier_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    registry.load()
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))

    class Plain:
        type: ClassVar[str] = "plain-test"
        params = ActionParams
        destructive: ClassVar[bool] = True

    with pytest.warns(DeprecationWarning, match="uses the earlier action protocol"):
        assert registry.register(Plain) is Plain
    wrapped = registry.get("plain-test")
    assert issubclass(wrapped, LegacyAction) and wrapped.legacy is Plain and wrapped.destructive


def test_the_example_plugin_is_an_action_of_the_base() -> None:
    cls = registry.get("example.jsonl")
    assert issubclass(cls, Action) and registry.runtime("example.jsonl") is cls  # it runs itself
    assert (cls.destructive, cls.unit, cls.entity_kinds) == (False, "entity", ALL_KINDS)  # the defaults


async def test_the_example_plugin_runs_through_the_runner(tmp_path: Path) -> None:
    out = tmp_path / "incidents.jsonl"
    runner = await ActionRunner.open(None, make_config())
    req = make_request("example.jsonl", {"path": str(out), "note": "alice idles n1/gpu0"},
                       facts={"gpu": {"index": 0}})
    record = await runner.process(req)
    assert (record.outcome, record.detail) == ("ok", f"appended to {out}")
    line = json.loads(out.read_text())
    assert (line["key"], line["note"], line["facts"]) == (req.key, "alice idles n1/gpu0", {"gpu": {"index": 0}})


async def test_a_plugin_is_refused_bad_parameters_like_a_built_in() -> None:
    record = await (await ActionRunner.open(None, make_config())).process(make_request("example.jsonl", {"path": ""}))
    assert record.outcome == "refused"
    assert record.error is not None and record.error.startswith("example.jsonl parameters: path:")
