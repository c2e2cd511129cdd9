"""Load a rule set from files and directories: every problem of the set as `file:line: message`, all at once."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jinja2 import nodes
from pydantic import ValidationError

from actions import registry
from gpuevents.yamlpos import Located, LocatedError, YamlDoc, parse_yaml, read_yaml_text
from rules.lang import calendars
from rules.lang.expr import ExprError, compile_condition, parse_expression
from rules.lang.model import (
    ActionSpec,
    CompiledAction,
    Rule,
    RuleSet,
    RuleSpec,
    cron_triggers,
)
from rules.lang.templates import compile_params, is_templated

if TYPE_CHECKING:
    from apscheduler.triggers.cron import CronTrigger

RULE_SUFFIXES = (".yaml", ".yml")


def rule_files(paths: Sequence[Path | str]) -> tuple[list[Path], list[Located]]:
    """The rule files named by `paths` (directories: their *.yaml, not *.test.yaml, sorted)."""
    files: list[Path] = []
    problems: list[Located] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(
                f for f in p.iterdir()
                if f.is_file() and f.suffix in RULE_SUFFIXES and not f.name.endswith((".test.yaml", ".test.yml"))
            )
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            problems.append(Located(str(p), 0, "no such file or directory"))
    return files, problems


def load_rule_set(paths: Sequence[Path | str], default_timezone: str = "UTC") -> RuleSet:
    """Load and compile every rule under `paths` as one set. Raises LocatedError listing every problem."""
    files, problems = rule_files(paths)
    rules: list[Rule] = []
    seen: dict[str, Rule] = {}
    for f in files:
        try:
            text = read_yaml_text(f, "rule file")
            doc = parse_yaml(text, str(f))
        except LocatedError as e:
            problems.extend(e.problems)
            continue
        file_rules, file_problems = load_document(doc, default_timezone, text)
        problems.extend(file_problems)
        for r in file_rules:
            first = seen.get(r.name)
            if first is not None:
                problems.append(
                    Located(r.file, r.line,
                            f"duplicate rule name {r.name!r} (first defined at {first.file}:{first.line})")
                )
                continue
            seen[r.name] = r
            rules.append(r)
    if problems:
        raise LocatedError(problems)
    return RuleSet(rules=tuple(rules), files=tuple(str(f) for f in files))


def load_document(doc: YamlDoc, default_timezone: str = "UTC", text: str = "") -> tuple[list[Rule], list[Located]]:
    """The rules of one parsed file, and its problems."""
    data = doc.data
    if data is None:
        return [], []
    if not isinstance(data, dict) or "rules" not in data:
        return [], [doc.locate((), "a rule file is a mapping with a top-level `rules:` list")]
    extra = sorted(str(k) for k in data if k != "rules")
    problems = [doc.locate((k,), f"{k}: unknown key; a rule file has only `rules:`") for k in extra]
    items = data["rules"]
    if not isinstance(items, list):
        return [], [*problems, doc.locate(("rules",), "rules: must be a list of rules")]
    rules = []
    for i, item in enumerate(items):
        rule, found = _load_rule(doc, i, item, default_timezone, text.splitlines())
        problems.extend(found)
        if rule is not None and not found:
            rules.append(rule)
    return rules, problems


def _load_rule(
    doc: YamlDoc, i: int, item: Any, default_tz: str, lines: list[str]
) -> tuple[Rule | None, list[Located]]:
    at: tuple[str | int, ...] = ("rules", i)
    if not isinstance(item, dict):
        return None, [doc.locate(at, "a rule is a mapping with name, entity, when and actions")]
    problems: list[Located] = [
        doc.locate((*at, str(k)), f"{str(k).lower()}: YAML reads `on`, `yes`, `no` and the like as "
                   "true/false, not as a key; the entity kind goes in `entity:`")
        if isinstance(k, bool) else doc.locate((*at, str(k)), f"{k}: keys are names, not numbers")
        for k in item if not isinstance(k, str)
    ]
    try:
        spec = RuleSpec.model_validate({k: v for k, v in item.items() if isinstance(k, str)})
    except ValidationError as e:
        return None, problems + [_name_pattern(p) for p in doc.validation_problems(e, prefix=at)]
    tz_name = spec.timezone or default_tz
    try:
        tz = calendars.zone(tz_name)
    except calendars.CalendarError as e:
        problems.append(doc.locate((*at, "timezone"), f"timezone: {e}"))
        tz = calendars.zone("UTC")
    condition = None
    try:
        condition = compile_condition(spec.when, spec.entity, tz)
    except ExprError as e:
        problems.append(Located(doc.file, doc.line_of((*at, "when")) + _block_offset(doc, at, lines) + e.line - 1,
                                f"when: {e}"))
    triggers: list[CronTrigger] = []
    for j, expr in enumerate(spec.schedules()):
        path = (*at, "schedule", j) if isinstance(spec.schedule, list) else (*at, "schedule")
        try:
            triggers.extend(cron_triggers(expr, tz))
        except ValueError as e:
            problems.append(doc.locate(path, f"schedule: {e}"))
    if spec.for_ is not None and spec.schedule is not None:
        problems.append(doc.locate((*at, "for"), "for: a rule with `schedule` cannot have `for`; a scheduled "
                                   "rule is evaluated only at its cron instants"))
    actions = _compile_actions(doc, (*at, "actions"), spec.actions, spec.entity, problems)
    on_resolve = _compile_actions(doc, (*at, "on_resolve"), spec.on_resolve, spec.entity, problems)
    if problems or condition is None:
        return None, problems
    return Rule(
        spec=spec,
        condition=condition,
        tz=tz,
        tz_name=tz_name,
        triggers=tuple(triggers),
        actions=tuple(actions),
        on_resolve=tuple(on_resolve),
        hash=rule_hash(spec, tz_name),
        file=doc.file,
        line=doc.line_of(at),
        legacy_hash=legacy_rule_hash(spec, tz_name),
        reads_liveness=spec.entity == "node" and reads_liveness(spec.when),
    ), []


def _block_offset(doc: YamlDoc, at: tuple[str | int, ...], lines: list[str]) -> int:
    """A `when: |` or `when: >` block starts on the line after its key."""
    key_line = doc.line_of((*at, "when"))
    if 0 < key_line <= len(lines):
        after = lines[key_line - 1].split("when:", 1)[-1].strip()
        if after[:1] in ("|", ">"):
            return 1
    return 0


def _name_pattern(p: Located) -> Located:
    message = p.message.removeprefix("rules.")
    if message.startswith("name: String should match pattern"):
        message = "name: must be lowercase letters, digits and dashes, like idle-gpu-2h"
    return Located(p.file, p.line, message)


HASH_IGNORES = ("description", "labels")
"""Fields a rule's hash leaves out: they change what messages say, not whether an open incident is right
(templates and requests read them from the running rule, so an edit shows at the next send)."""


def _hash_body(spec: RuleSpec, tz_name: str) -> dict[str, Any]:
    """The spec as hashed. Fields added later are left out at their defaults, so an upgrade does not change the
    hash of a rule that does not use them (and close its incidents as `rule_changed`)."""
    body = spec.model_dump(mode="json", by_alias=True)
    body["timezone"] = tz_name
    if spec.snooze_max == RuleSpec.model_fields["snooze_max"].default:
        body.pop("snooze_max", None)
    if not spec.limits.fleet_floor and isinstance(body.get("limits"), dict):
        body["limits"].pop("fleet_floor", None)
    for key in ("actions", "on_resolve"):
        for action in body.get(key) or []:
            if action.get("after") is None:
                action.pop("after", None)
            if action.get("approve") is None:
                action.pop("approve", None)
                action.pop("approve_within", None)
            if action.get("require_warning") is True:
                action.pop("require_warning", None)
    return body


def rule_hash(spec: RuleSpec, tz_name: str) -> str:
    """What makes a rule behave differently: a reload closes the open incidents of a rule whose hash changed."""
    body = _hash_body(spec, tz_name)
    for k in HASH_IGNORES:
        body.pop(k, None)
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


LIVENESS_FIELDS = frozenset({"online", "last_seen"})


def reads_liveness(source: str) -> bool:
    """Whether a condition reads `online` or `last_seen` (as an attribute, or a key: `node['online']`)."""
    try:
        expr = parse_expression(source)
    except ExprError:
        return False
    return any(n.attr in LIVENESS_FIELDS for n in expr.find_all(nodes.Getattr)) or any(
        n.value in LIVENESS_FIELDS for n in expr.find_all(nodes.Const))


def legacy_rule_hash(spec: RuleSpec, tz_name: str) -> str:
    """The hash over the whole spec that incidents stored by earlier engines carry."""
    body = _hash_body(spec, tz_name)
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _compile_actions(
    doc: YamlDoc, at: tuple[str | int, ...], specs: list[ActionSpec], kind: str, problems: list[Any]
) -> list[CompiledAction]:
    out = []
    for idx, spec in enumerate(specs):
        path = (*at, idx)
        try:
            cls = registry.get(spec.type)
        except registry.UnknownActionError as e:
            problems.append(doc.locate((*path, "type"), f"{at[-1]}[{idx}].type: {e}"))
            continue
        if cls.engine_only:
            problems.append(doc.locate((*path, "type"), f"{at[-1]}[{idx}].type: `{spec.type}` is not written in "
                                       f"rules: {cls.engine_only}"))
            continue
        kinds = cls.entity_kinds
        if kind not in kinds:
            problems.append(doc.locate((*path, "type"), f"{at[-1]}[{idx}]: a {spec.type} action does not apply "
                                       f"to a {kind} rule (it acts on {', '.join(sorted(kinds))})"))
        raw = spec.params()
        raw = _inline_template_file(doc, path, cls, raw, problems)
        problems.extend(_check_params(doc, path, spec.type, cls, raw))
        tree, errors = compile_params(raw, kind, registry.escape_for(spec.type))
        for p, err in errors:
            line = doc.line_of((*path, *p)) + max(0, err.line - 1)
            key = ".".join(str(x) for x in p)
            problems.append(Located(doc.file, line, f"{key}: {err}"))
        if spec.approve is not None and not cls.destructive:
            problems.append(doc.locate((*path, "approve"), f"{at[-1]}[{idx}].approve: only destructive actions wait "
                                       f"for an approval; {spec.type} is not one"))
        if spec.after is not None and at[-1] == "on_resolve":
            problems.append(doc.locate((*path, "after"), f"{at[-1]}[{idx}].after: `after` is for `actions` (a "
                                       "staged action runs while the incident fires), not `on_resolve`"))
        out.append(CompiledAction(type=spec.type, index=idx, params=tree,
                                  destructive=cls.destructive, unit=cls.unit, line=doc.line_of(path),
                                  after_s=spec.after, approve=spec.approve, approve_within_s=spec.approve_within,
                                  require_warning=spec.require_warning))
    return out


def _inline_template_file(doc: YamlDoc, path: tuple[str | int, ...], cls: type[registry.AnyAction],
                          raw: dict[str, Any], problems: list[Any]) -> dict[str, Any]:
    """`template: FILE` (relative to the rule file) becomes `text:` with the file's content, compiled
    like any other template, so a message kept in its own file is checked at load like an inline one."""
    fields = cls.params.model_fields
    name = raw.get("template")
    if not isinstance(name, str) or "text" not in fields or "template" not in fields:
        return raw
    if raw.get("text"):
        problems.append(doc.locate((*path, "template"), "give `text` or `template`, not both"))
        return raw
    file = Path(name) if Path(name).is_absolute() else Path(doc.file).parent / name
    try:
        content = file.read_text()
    except OSError as e:
        problems.append(doc.locate((*path, "template"), f"template: cannot read {file}: {e.strerror}"))
        return raw
    return {k: v for k, v in raw.items() if k != "template"} | {"text": content}


def _check_params(doc: YamlDoc, path: tuple[str | int, ...], type_: str, cls: type[registry.AnyAction],
                  raw: dict[str, Any]) -> list[Located]:
    """Validate the parameters with the action's model, except values that templates fill in at run time."""
    try:
        cls.params.model_validate({**raw, "type": type_})
    except ValidationError as e:
        out = []
        for err in e.errors():
            loc = tuple(err["loc"])
            value: Any = raw
            for part in loc:
                if isinstance(value, dict) and part in value:
                    value = value[part]
                elif isinstance(value, list) and isinstance(part, int) and part < len(value):
                    value = value[part]
                else:
                    break
            if loc and loc[0] in raw and is_templated(value):
                continue
            key = ".".join(str(x) for x in loc)
            if err["type"] == "extra_forbidden":
                msg = "unknown parameter; check its spelling against the action's documentation"
            else:
                msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "missing":
                msg = "is required"
            out.append(doc.locate((*path, *loc), f"{type_}.{key}: {msg}" if key else f"{type_}: {msg}"))
        return out
    return []
