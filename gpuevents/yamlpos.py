"""YAML loading that remembers the line of every key, so errors can say `file:line: key: problem`."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

Path = tuple[str | int, ...]
PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class Located:
    """A problem at a place in a file."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line > 0 else self.file
        return f"{where}: {self.message}"


class LocatedError(Exception):
    """One or more located problems; `str()` lists them a line each."""

    def __init__(self, problems: Sequence[Located]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


@dataclass
class YamlDoc:
    """A parsed YAML document and the line (1-based) of every path in it."""

    file: str
    data: Any
    lines: dict[Path, int] = field(default_factory=dict)

    def line_of(self, path: Iterable[str | int]) -> int:
        """Line of `path`, or of its nearest ancestor that has one."""
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return self.lines.get((), 1)

    def locate(self, path: Iterable[str | int], message: str) -> Located:
        return Located(self.file, self.line_of(path), message)

    def validation_problems(
        self, err: ValidationError, prefix: Path = (), show_key: bool = True
    ) -> list[Located]:
        """Pydantic errors as located problems; `prefix` is where the validated object sits."""
        out = []
        for e in err.errors():
            loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-")))
            full = prefix + loc
            key = ".".join(str(x) for x in full if isinstance(x, str))
            msg = _message(e)
            out.append(self.locate(full, f"{key}: {msg}" if show_key and key else msg))
        return out


def _message(e: Any) -> str:
    msg = str(e["msg"])
    if e["type"] == "extra_forbidden":
        return "unknown key; check its spelling against the documentation"
    if e["type"] == "missing":
        return "is required"
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return msg


MAX_YAML_BYTES = 2 * 1024 * 1024
"""A rule, config, test or scenario file larger than this is refused before it is parsed."""
MAX_ALIAS_NODES = 10_000
"""Values that aliases (`*name`) may add to a document beyond what it writes out: anchors for shared settings
fit easily; a "billion laughs" (aliases of aliases of aliases, 618 bytes for a gigabyte) does not."""

_YAML_WORDS: tuple[tuple[str, str], ...] = (
    ("mapping values are not allowed", "a `key: value` where none can be: this line is indented more than the "
     "key above it expects, or a value holding ': ' needs quotes"),
    ("expected <block end>", "this line's indentation does not line up: the keys of one mapping (and the `-` "
     "items of one list) start in the same column as the lines above"),
    ("could not find expected ':'", "a key without `:`, or a line indented wrongly above it"),
    ("cannot start any token", "a character YAML cannot start a value with (a tab? indent with spaces only; "
     "`@` or a backquote? put the value in quotes)"),
    ("found unexpected end of stream", "a quote or a bracket is not closed"),
    ("did not find expected key", "a line indented wrongly, or a `-` item among keys"),
    ("did not find expected '-' indicator", "a list item that does not line up with the `-` items above it"),
)


def yaml_problem(e: yaml.YAMLError) -> str:
    """PyYAML's complaint in the project's words, with the column (its own words when it is not one of ours)."""
    problem = str(getattr(e, "problem", None) or e)
    mark = getattr(e, "problem_mark", None)
    column = f" (column {mark.column + 1})" if mark is not None else ""
    for needle, words in _YAML_WORDS:
        if needle in problem:
            return f"invalid YAML{column}: {words}"
    return f"invalid YAML{column}: {problem}"


class _Loader(yaml.SafeLoader):
    pass


def read_yaml_text(path: PathLike, what: str = "file") -> str:
    """The text of a YAML file, refused (LocatedError, `file: …`) when unreadable, not UTF-8 or over the size
    limit: a file anyone could drop into a watched folder must stay cheap to read."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_YAML_BYTES + 1)
    except OSError as e:
        raise LocatedError([Located(str(path), 0, f"cannot read {what}: {e.strerror}")]) from None
    if len(raw) > MAX_YAML_BYTES:
        raise LocatedError([Located(str(path), 0, f"larger than {MAX_YAML_BYTES // (1024 * 1024)} MiB; a {what} "
                                                  "this size is refused (split it into several files)")])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise LocatedError([Located(str(path), line, f"not UTF-8 text (byte {raw[e.start]:#04x}); save the "
                                                     "file as UTF-8")]) from None


def parse_yaml(text: str, file: str) -> YamlDoc:
    """Parse `text`; a syntax error becomes a LocatedError with the line YAML reports, and so does a document
    over the size limit or whose aliases expand beyond `MAX_ALIAS_NODES` values."""
    if len(text) > MAX_YAML_BYTES:
        raise LocatedError([Located(file, 0, f"larger than {MAX_YAML_BYTES // (1024 * 1024)} MiB; refused "
                                             "(split it into several files)")])
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        raise LocatedError([Located(file, line, yaml_problem(e))]) from None
    doc = YamlDoc(file=file, data=None)
    if node is None:
        return doc
    constructor = _Loader("")
    try:
        doc.data = _build(node, (), doc, constructor, _Budget())
    except RecursionError:
        raise LocatedError([Located(file, 1, "invalid YAML: an alias refers to itself (or nests too deep)")]) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise LocatedError([Located(file, mark.line + 1 if mark else 1, yaml_problem(e))]) from None
    return doc


class _Budget:
    """Counts the values built a second time or more (through an alias), up to MAX_ALIAS_NODES."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.repeats = 0

    def visit(self, node: yaml.Node, file: str, line: int) -> bool:
        """Whether `node` is written out here (first visit); `line`: where the alias that reached it is."""
        if id(node) not in self.seen:
            self.seen.add(id(node))
            return True
        self.repeats += 1
        if self.repeats > MAX_ALIAS_NODES:
            raise LocatedError([Located(file, line, f"aliases expand to more than {MAX_ALIAS_NODES:,} values "
                                                    "(an alias bomb?); write the values out, or alias less")])
        return False


def _build(node: yaml.Node, path: Path, doc: YamlDoc, c: yaml.SafeLoader, budget: _Budget, line: int = 1) -> Any:
    if budget.visit(node, doc.file, line):
        line = node.start_mark.line + 1  # an alias inside a repeated value is reported where the repeat began
    doc.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        c.flatten_mapping(node)
        for k_node, v_node in node.value:
            if not isinstance(k_node, yaml.ScalarNode):
                raise LocatedError([Located(doc.file, k_node.start_mark.line + 1, "keys must be plain scalars")])
            key = c.construct_object(k_node, deep=True)
            if not isinstance(key, str | int | float | bool) or key is None:
                raise LocatedError([Located(doc.file, k_node.start_mark.line + 1, "keys must be plain scalars")])
            if key in out:
                raise LocatedError(
                    [Located(doc.file, k_node.start_mark.line + 1, f"{key}: duplicate key")]
                )
            kpath = (*path, str(key))
            doc.lines[kpath] = k_node.start_mark.line + 1
            out[str(key) if isinstance(key, str) else key] = _build(v_node, kpath, doc, c, budget, line)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(item, (*path, i), doc, c, budget, line) for i, item in enumerate(node.value)]
    return c.construct_object(node, deep=True)


def parse_scalar(text: str) -> Any:
    """A value from an environment variable, read as YAML (`true`, `5`, `[a, b]`, `2h`), aliases bounded."""
    try:
        return parse_yaml(text, "<env>").data
    except LocatedError:
        return text
