"""Action templates: every string parameter is a Jinja2 template, sandboxed, strict, compiled at load.

Whatever a `{{ }}` outputs passes through the destination's escape function (Jinja2's `finalize`), so a
process called `<!channel>` cannot ping a Slack channel; the rule author's literal text is left as written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jinja2 import StrictUndefined, Template, TemplateSyntaxError, meta, nodes
from jinja2.sandbox import SandboxedEnvironment

from gpuevents.durations import format_duration
from rules.lang.expr import ENTITY_NAMES, HELPERS
from rules.lang.views import FIELDS_OF

TEMPLATE_EXTRA_NAMES = frozenset({"rule", "incident", "cost", "now"})

_envs: dict[Callable[[str], str], SandboxedEnvironment] = {}


class TemplateError(ValueError):
    """A template that does not compile or names something that is not in scope."""

    def __init__(self, message: str, line: int = 1) -> None:
        super().__init__(message)
        self.line = line


def _finalizer(escape: Callable[[str], str]) -> Callable[[Any], Any]:
    def finalize(value: Any) -> str:
        if value is None:  # a missing owner renders empty (and fails validation), never as "None"
            return ""
        return escape(value if isinstance(value, str) else str(value))

    return finalize


def _format_duration(seconds: Any) -> str:
    """`{{ gpu.idle_for_s | format_duration }}` → `2h 5m`: seconds as people read them."""
    return format_duration(float(seconds or 0))


def environment_for(escape: Callable[[str], str]) -> SandboxedEnvironment:
    """The sandbox that renders into a destination with this escape function (one per function)."""
    env = _envs.get(escape)
    if env is None:
        env = SandboxedEnvironment(
            undefined=StrictUndefined, finalize=_finalizer(escape), autoescape=False, keep_trailing_newline=True
        )
        env.filters["format_duration"] = _format_duration
        _envs[escape] = env
    return env


def names_for(kind: str) -> frozenset[str]:
    return ENTITY_NAMES[kind] | HELPERS | TEMPLATE_EXTRA_NAMES


@dataclass(frozen=True)
class CompiledTemplate:
    source: str
    template: Template

    def render(self, names: Mapping[str, Any]) -> str:
        """Render with `names` (which must include the environment's globals, see `with_globals`).

        Template.render would copy and merge the names into a fresh context on every call; sharing
        them is what makes a storm of a thousand firings cheap."""
        ctx = self.template.new_context(dict(names), shared=True)
        return self.template.environment.concat(self.template.root_render_func(ctx))


def compile_template(source: str, kind: str, escape: Callable[[str], str]) -> CompiledTemplate | str:
    """A template, or the string itself when it has no Jinja2 syntax. Raises TemplateError."""
    if "{" not in source:
        return source
    env = environment_for(escape)
    try:
        tree = env.parse(source)
        template = env.from_string(tree)
    except TemplateSyntaxError as e:
        raise TemplateError(f"template syntax error: {e.message}", e.lineno) from None
    allowed = names_for(kind) | frozenset(env.globals)
    unknown = sorted(meta.find_undeclared_variables(tree) - allowed)
    if unknown:
        raise TemplateError(
            f"unknown name {unknown[0]!r} in the template; names in scope: {', '.join(sorted(names_for(kind)))}"
        )
    for node in tree.find_all(nodes.Getattr):
        if isinstance(node.node, nodes.Name) and node.node.name in FIELDS_OF and node.ctx == "load":
            fields = FIELDS_OF[node.node.name]
            if node.attr not in fields and not node.attr.startswith("_"):
                raise TemplateError(f"{node.node.name} has no field {node.attr!r}; fields: "
                                    f"{', '.join(sorted(fields))}", node.lineno)
    return CompiledTemplate(source, template)


_GLOBALS = dict(SandboxedEnvironment().globals)


def with_globals(names: Mapping[str, Any]) -> dict[str, Any]:
    """Jinja2's default globals (`range`, `dict`, ...) under the names, as Template.render would add them."""
    return {**_GLOBALS, **names}


ParamTree = Any  # str | CompiledTemplate | int | float | bool | None | list[ParamTree] | dict[str, ParamTree]


def compile_params(
    params: Mapping[str, Any], kind: str, escape_at: Callable[[tuple[str | int, ...]], Callable[[str], str]]
) -> tuple[dict[str, ParamTree], list[tuple[tuple[str | int, ...], TemplateError]]]:
    """Compile every string leaf of `params`, each with the escape of where it lands (`escape_at(path)`);
    returns the tree and the errors with their paths."""
    errors: list[tuple[tuple[str | int, ...], TemplateError]] = []

    def walk(value: Any, path: tuple[str | int, ...]) -> ParamTree:
        if isinstance(value, str):
            try:
                return compile_template(value, kind, escape_at(path))
            except TemplateError as e:
                errors.append((path, e))
                return value
        if isinstance(value, list):
            return [walk(v, (*path, i)) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {k: walk(v, (*path, k)) for k, v in value.items()}
        return value

    tree = {k: walk(v, (k,)) for k, v in params.items()}
    return tree, errors


def render_params(tree: Mapping[str, ParamTree], names: Mapping[str, Any]) -> dict[str, Any]:
    """Render every template of a compiled parameter tree. Jinja2 errors propagate."""
    names = with_globals(names)

    def walk(value: ParamTree) -> Any:
        if isinstance(value, CompiledTemplate):
            return value.render(names)
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        return value

    return {k: walk(v) for k, v in tree.items()}


def is_templated(value: Any) -> bool:
    """A raw parameter value whose final form is only known after rendering."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, list):
        return any(is_templated(v) for v in value)
    if isinstance(value, dict):
        return any(is_templated(v) for v in value.values())
    return False
