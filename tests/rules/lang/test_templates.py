"""Templates: sandboxed, strict, compiled at load, machine values escaped for the destination."""

from __future__ import annotations

import pytest
from jinja2.exceptions import SecurityError, UndefinedError

from rules.lang.templates import (
    CompiledTemplate,
    TemplateError,
    compile_params,
    compile_template,
    render_params,
)


def shout(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;")


def test_plain_text_stays_a_string() -> None:
    assert compile_template("no templates here", "gpu", shout) == "no templates here"


def test_outputs_are_escaped_and_the_authors_text_is_not() -> None:
    t = compile_template("<b>{{ gpu.model }}</b>", "gpu", shout)
    assert isinstance(t, CompiledTemplate)
    assert t.render({"gpu": {"model": "<!channel>"}}) == "<b>&lt;!channel&gt;</b>"


def test_none_renders_empty_and_numbers_as_text() -> None:
    t = compile_template("[{{ gpu.owner }}] {{ gpu.index }}", "gpu", shout)
    assert isinstance(t, CompiledTemplate)
    assert t.render({"gpu": {"owner": None, "index": 3}}) == "[] 3"


def test_a_misspelt_field_names_the_entity_kind_and_its_fields_at_compile() -> None:
    with pytest.raises(TemplateError,
                       match=r"^gpu has no field 'ownr'; fields: activity_known, allocated, .* owner, owners, "):
        compile_template("{{ gpu.ownr }}", "gpu", shout)


def test_undefined_keys_below_a_field_are_errors_at_render() -> None:
    t = compile_template("{{ node.labels.tier }}", "gpu", shout)
    assert isinstance(t, CompiledTemplate)
    with pytest.raises(UndefinedError):
        t.render({"node": {"labels": {}}})


def test_the_sandbox_refuses_internals() -> None:
    t = compile_template("{{ gpu.__class__.__mro__ }}", "gpu", shout)
    assert isinstance(t, CompiledTemplate)
    with pytest.raises((SecurityError, UndefinedError)):
        t.render({"gpu": object()})


@pytest.mark.parametrize(
    ("source", "message"),
    [("{{ gpu.index ", "template syntax error"), ("{{ owner }}", "unknown name 'owner'"),
     ("{{ process.pid }}", "unknown name 'process'")],
)
def test_compile_errors(source: str, message: str) -> None:
    with pytest.raises(TemplateError) as e:
        compile_template(source, "gpu", shout)
    assert message in str(e.value)


def test_nested_parameters_render_every_string_leaf() -> None:
    tree, errors = compile_params({"argv": ["echo", "{{ node.name }}"], "headers": {"X": "{{ rule.name }}"}, "n": 3},
                                  "node", lambda _path: shout)
    assert errors == []
    out = render_params(tree, {"node": {"name": "n<1>"}, "rule": {"name": "r"}})
    assert out == {"argv": ["echo", "n&lt;1&gt;"], "headers": {"X": "r"}, "n": 3}
