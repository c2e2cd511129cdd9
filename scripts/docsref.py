"""The reference pages of the documentation site, generated from the code at build time (scripts/mkdocs_hooks.py):
rules from the rule model, actions from the registered action specs, the CLI from its Typer commands and the
configuration from the config model with the comments of config.example.yaml."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import typer.main
import yaml
from docsref_models import as_text, cell, rows, table, table_of
from typer import _click

ROOT = Path(__file__).resolve().parents[1]

GENERATED = "<!-- Generated from the code when the site is built; edit the code, not this page. -->\n\n"


# ---------------------------------------------------------------- rules
def rules_page() -> str:
    from rules.lang.model import ActionSpec, EntityKind, RuleLimits, RuleSpec

    kinds = ", ".join(f"`{k}`" for k in get_args(EntityKind))
    out = [GENERATED, "# Rules reference\n\n",
           "A rule file is a YAML mapping with one key, `rules`, a list of rules. Each rule has the keys below "
           "(from `rules.lang.model.RuleSpec`); unknown keys are errors that `gpuevents rules check` reports as "
           "`file:line: message`. How to write conditions, templates and tests: [Writing rules](../rules.md).\n\n",
           f"## A rule\n\nThe entity kinds a rule can watch: {kinds}.\n\n",
           table(RuleSpec, skip=frozenset({"limits", "actions", "on_resolve"})),
           "\n## `limits`\n\nPer rule, on top of the engine's per action type limits (`engine.limits`).\n\n",
           table(RuleLimits, "limits."),
           "\n## An action item (`actions`, `on_resolve`)\n\n"
           "Every item of `actions` and `on_resolve` has a `type` (an action type: [Actions reference](actions.md)),"
           " that action's own parameters, and these keys that every action shares:\n\n",
           table(ActionSpec),
           "\n## The rule library\n\n`rules/library/` ships these rules, each file with a `.test.yaml` beside it "
           "(`gpuevents rules test rules/library`):\n\n",
           _library_table()]
    return "".join(out)


def _library_table() -> str:
    lines = ["| file | rule | entity | what it does |", "| --- | --- | --- | --- |"]
    library = ROOT / "rules" / "library"
    for path in sorted(p for p in library.rglob("*.yaml") if not p.name.endswith(".test.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        for rule in data.get("rules", []):
            lines.append(f"| `{path.relative_to(library)}` | `{rule.get('name', '')}` | {rule.get('entity', '')} | "
                         f"{cell(str(rule.get('description', '')))} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- actions
def actions_page() -> str:
    from actions import registry

    registry.load()
    out = [GENERATED, "# Actions reference\n\n",
           "Every action type the engine knows, from its registered spec (`actions/specs/`, and plugins through "
           "the `gpuevents.actions` entry point): what it acts on, whether it is destructive (protection, "
           "fleet-share limits, approvals and the warned-first check apply), and its parameters. Parameters are "
           "Jinja2 templates over the entity. How each action behaves, with examples: [Actions](../actions.md). "
           "The keys every action item takes (`after`, `approve`, ...): "
           "[Rules reference](rules.md#an-action-item-actions-on_resolve).\n\n"]
    for type_ in sorted(registry._registry):
        spec = registry._registry[type_]
        module = inspect.getmodule(spec)
        doc = (module.__doc__ or "") if module is not None else ""
        first = doc.split(";")[0].split("\n\n")[0]
        summary = re.sub(r"^The `[^`]+`( and `[^`]+`)? actions?'s? parameters: ", "", first)
        kinds = ", ".join(sorted(spec.entity_kinds))
        out.append(f"## {type_}\n\n")
        if summary:
            summary = " ".join(summary.split()).rstrip(".")
            out.append(summary[:1].upper() + summary[1:] + ".\n\n")
        out.append(f"- acts on: {kinds}\n- destructive: {'yes' if spec.destructive else 'no'}\n"
                   f"- limits count: {'nodes' if spec.unit == 'node' else 'entities'}\n")
        if spec.engine_only:
            out.append(f"- runs in the engine: {spec.engine_only}\n")
        out.append("\n")
        out.append(table(spec.params, skip=frozenset({"type"})))
        out.append("\n")
    return "".join(out)


# ---------------------------------------------------------------- CLI
def cli_page() -> str:
    from gpuevents.cli import app

    root = typer.main.get_command(app)
    ctx = _click.Context(root, info_name="gpuevents")
    out = [GENERATED, "# CLI reference\n\n",
           "Every `gpuevents` command with its arguments and options, read from the commands themselves. "
           "`gpuevents COMMAND --help` prints the same.\n\n"]
    for path, command in _commands(root, ctx, ["gpuevents"]):
        out.append(_command_section(path, command))
    return "".join(out)


def _commands(command: Any, ctx: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    if hasattr(command, "list_commands"):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            yield from _commands(sub, _click.Context(sub, parent=ctx, info_name=name), [*path, name])
    elif len(path) > 1:
        yield path, command


def _arg_name(param: Any) -> str:
    return str(param.metavar or param.name or "").upper()


def _command_section(path: list[str], command: Any) -> str:
    name = " ".join(path)
    args = " ".join(_arg_name(p) + ("..." if p.nargs == -1 else "")
                    for p in command.params if p.param_type_name == "argument")
    help_text = as_text(inspect.cleandoc(command.help or "").replace("\b\n", ""))
    lines = [f"## {' '.join(path[1:])}\n\n", f"```\n{name} [OPTIONS]{' ' + args if args else ''}\n```\n\n",
             f"{help_text}\n\n" if help_text else "",
             "| argument or option | default | what it is |\n| --- | --- | --- |\n"]
    for p in command.params:
        if getattr(p, "hidden", False):
            continue
        names = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts]) if p.param_type_name == "option" \
            else f"`{_arg_name(p)}`"
        default = "" if p.default is None or p.param_type_name == "argument" or p.default == () else f"`{p.default}`"
        if p.param_type_name == "option" and getattr(p, "is_flag", False) and p.default is False:
            default = ""
        required = " (required)" if p.required else ""
        lines.append(f"| {names}{required} | {cell(default)} | {cell(getattr(p, 'help', None) or '')} |\n")
    lines.append("\n")
    return "".join(lines)


# ---------------------------------------------------------------- configuration
def config_page() -> str:
    from gpuevents.config import Config

    comments = example_comments(ROOT / "config.example.yaml")
    out = [GENERATED, "# Configuration reference\n\n",
           "Every key of the configuration file, from the config model (`gpuevents.config.Config`), described by "
           "the model or by `config.example.yaml` (in the repository's root)"
           ", which lists every key with its default. Durations are written `90s`, `15m`, `2h`, `7d` (or seconds). "
           "Any key can be set from the environment: `GPUEVENTS_<SECTION>__<KEY>`, e.g. "
           "`GPUEVENTS_ENGINE__DRY_RUN=true`. Secrets never go in the file (`gpuevents config check` refuses keys "
           "named `token`, `password`, `secret`, ...): they come from the environment or a `*_file` key. "
           "Check a file with `gpuevents config check -c config.yaml`.\n\n"]
    sections: dict[str, list[tuple[str, str, str, str]]] = {}
    for row in rows(Config, describe=lambda key: comments.get(key, "")):
        section = row[0].split(".")[0]
        if section != "owner_addresses" and (row[0] != section or row[1] != "mapping"):  # not the section's own row
            sections.setdefault(section, []).append(row)
    for name, found in sections.items():
        out.append(f"## `{name}`\n\n{table_of(found)}\n")
    return "".join(out)


def example_comments(path: Path) -> dict[str, str]:
    """The comment on or above each key of a commented YAML file, by dotted key."""
    lines = path.read_text().splitlines()
    found: dict[str, str] = {}

    def walk(node: yaml.Node, prefix: str) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for key, value in node.value:
            dotted = f"{prefix}{key.value}"
            found[dotted] = _comment_at(lines, key.start_mark.line, key.start_mark.column)
            walk(value, f"{dotted}.")

    root = yaml.compose(path.read_text())
    if root is not None:
        walk(root, "")
    return found


def _comment_at(lines: list[str], line: int, column: int) -> str:
    """The trailing comment of `line` and the comment lines that continue it, else the comment block above."""
    text = lines[line]
    at = text.find(" #")
    if at >= 0:
        parts = [text[at + 2:].strip()]
        indent = at + 1
        for nxt in lines[line + 1:]:
            stripped = nxt.lstrip()
            depth = len(nxt) - len(stripped)
            if stripped.startswith("#") and depth >= indent - 1 and depth > column:
                parts.append(stripped[1:].strip())
            else:
                break
        return " ".join(parts)
    above: list[str] = []
    for prev in reversed(lines[:line]):
        stripped = prev.lstrip()
        if stripped.startswith("#") and len(prev) - len(stripped) == column:
            above.append(stripped[1:].strip())
        else:
            break
    return " ".join(reversed(above))
