"""Machine values escaped for where they go: an argv element never starts an option, for every action that
builds an argv."""

from __future__ import annotations

import pytest

from actions.escaping import UnsafeValue
from actions.registry import escape_for
from rules.lang.templates import compile_params, render_params


def test_a_machine_value_that_would_start_an_option_refuses_the_command() -> None:
    tree, errors = compile_params({"argv": ["rm", "{{ process.name }}"]}, "process", escape_for("command"))
    assert errors == []
    with pytest.raises(UnsafeValue, match="starts with '-'"):
        render_params(tree, {"process": {"name": "-rf"}})
    assert render_params(tree, {"process": {"name": "a-b"}}) == {"argv": ["rm", "a-b"]}


ARGV_ACTIONS = [
    ("command", {}),
    ("cordon", {"provider": "command"}),
    ("uncordon", {"provider": "command"}),
    ("scale", {"provider": "command", "replicas": 0}),
]


@pytest.mark.parametrize(("type_", "extra"), ARGV_ACTIONS, ids=[t for t, _ in ARGV_ACTIONS])
def test_every_action_that_builds_an_argv_refuses_a_machine_value_that_starts_an_option(
        type_: str, extra: dict[str, object]) -> None:
    tree, errors = compile_params({**extra, "argv": ["tool", "--node={{ node }}", "{{ node }}"]}, "process",
                                  escape_for(type_))
    assert errors == []
    with pytest.raises(UnsafeValue, match="starts with '-'"):
        render_params(tree, {"node": "--all"})
    assert render_params(tree, {"node": "n-1"})["argv"] == ["tool", "--node=n-1", "n-1"]
