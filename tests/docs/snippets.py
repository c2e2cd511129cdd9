"""What the documentation shows a reader: the `gpuevents ...` command lines and the configuration snippets of
README.md and docs/*.md, each with the file:line it is on, read as the files are when the tests run."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHELL_LANGS = frozenset({"", "sh", "bash", "console", "shell", "text", "ini", "dockerfile"})

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)(?P<info>.*)$")
_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
# `gpuevents` where a shell runs it: a line's start, after `$ `, `&&`, `|`, `;`, `--`, `sudo`, `exec`, an
# `ExecStart=` or `VAR=value` assignments; optionally by a path (`.venv/bin/gpuevents`).
_AT_COMMAND = re.compile(
    r"(?:^|&&|\|\||[|;(]|\s--\s|\bsudo\s|\bexec\s|ExecStart=|^\$\s)\s*(?:[A-Z_][A-Z0-9_]*=\S*\s+)*"
    r"(?:\S*/)?gpuevents\s+(?P<rest>[^\s#].*)$")
_TITLE = re.compile(r'title="(?P<title>[^"]*)"')


@dataclass(frozen=True)
class Where:
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Command:
    """A documented `gpuevents` command line: the words after `gpuevents`, up to a shell operator or comment."""

    where: Where
    text: str
    words: tuple[str, ...]
    after: Command | None = None
    """Set for a word listed after a command (`gpuevents up`, `simulate`): it names a sibling of that command
    (or, starting with `-`, more of its options)."""


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language, the `title="..."` of its info string, its text."""

    where: Where
    lang: str
    title: str
    text: str


def doc_files(root: Path = REPO) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("**/*.md"))]


def blocks(path: Path, root: Path = REPO) -> Iterator[Block]:
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(m.group("fence")):
            end += 1
        indent = len(m.group("indent"))
        title = _TITLE.search(m.group("info"))
        yield Block(Where(_name(path, root), i + 1), m.group("lang").lower(), title.group("title") if title else "",
                    "\n".join(line[indent:] for line in lines[i + 1:end]))
        i = end + 1


def commands(path: Path, root: Path = REPO) -> Iterator[Command]:
    """Every `gpuevents ...` command of a file: in shell-like fenced blocks, one per line (a line ending in `\\`
    continues), and in inline code spans outside blocks."""
    name = _name(path, root)
    in_block: set[int] = set()
    for block in blocks(path, root):
        body = block.text.splitlines()
        in_block.update(range(block.where.line, block.where.line + len(body) + 2))
        if block.lang not in SHELL_LANGS:
            continue
        joined = _join_continuations(body)
        for offset, line in joined:
            yield from _found(Where(name, block.where.line + 1 + offset), line)
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if number in in_block:
            continue
        yield from _spans(Where(name, number), line)


# Between two code spans of one list: `a`, `b` / `a` / `b` / `a` or `b` / `a`, and `b`.
_LIST_SEPARATOR = re.compile(r"^\s*(?:,|/|,?\s*or|,?\s*and)\s*$")
_VERB = re.compile(r"^(?:[a-z][a-z-]*|-{1,2}[a-z][a-z-]*)(?:\s|$)")


def _spans(where: Where, line: str) -> Iterator[Command]:
    """The commands of a line's code spans, and the words listed after one: "`gpuevents up`, `simulate`"."""
    last: Command | None = None
    end = 0
    for m in _SPAN.finditer(line):
        text = m.group(1).strip()
        found = next(_found(where, text), None)
        if found is not None:
            yield found
            last = found
        elif last is not None and _LIST_SEPARATOR.match(line[end:m.start()]) and _VERB.match(text):
            words = tuple(shlex.split(text)) if "'" not in text and '"' not in text else tuple(text.split())
            last = Command(where, text, words, after=last)
            yield last
        else:
            last = None
        end = m.end()


def _join_continuations(body: list[str]) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    start, parts = 0, list[str]()
    for i, line in enumerate(body):
        if not parts:
            start = i
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        parts.append(line)
        out.append((start, " ".join(parts)))
        parts = []
    if parts:
        out.append((start, " ".join(parts)))
    return out


def _found(where: Where, line: str) -> Iterator[Command]:
    m = _AT_COMMAND.search(line.strip())
    if m is None:
        return
    rest = re.split(r"\s(?:&&|\|\||\||;|>|2>|<)\s|\s#", " " + m.group("rest") + " ")[0].strip()
    try:
        words = shlex.split(rest)
    except ValueError:
        words = rest.split()
    yield Command(where, f"gpuevents {rest}", tuple(words))


def option_names(word: str) -> list[str]:
    """The options a documented word names: `[--demo]` -> --demo, `--since=7d` -> --since,
    `--week|--weeks` -> both; [] for a word that is not an option."""
    word = word.strip("[](),.`").rstrip(".")
    if not word.startswith("-") or word in ("-", "--"):
        return []
    return [w.split("=")[0] for w in word.split("|") if w.startswith("-")]


def config_snippets(path: Path, sections: frozenset[str], root: Path = REPO) -> Iterator[tuple[Where, str]]:
    """The configuration a file shows, as whole config files: every YAML block whose top-level keys are all
    config sections (none holding a list), and every block titled `config.yaml` (the whole file) or
    `config.yaml: a.b` (a part that lives under key a.b, nested under it here)."""
    import yaml

    for block in blocks(path, root):
        if block.lang not in ("yaml", "yml"):
            continue
        title = block.title.strip()
        if title.startswith("config.yaml:"):
            keys = title.split(":", 1)[1].strip().split(".")
            nested = "\n".join(("  " * depth) + f"{key}:" for depth, key in enumerate(keys))
            body = "\n".join(("  " * len(keys)) + line for line in block.text.splitlines())
            yield block.where, f"{nested}\n{body}\n"
            continue
        try:
            data = yaml.safe_load(block.text)
        except yaml.YAMLError:
            if title == "config.yaml":
                yield block.where, block.text
            continue
        # the top-level config sections are mappings or scalars: `actions:` holding a list is a rule's actions
        looks_like = isinstance(data, dict) and bool(data) and set(map(str, data)) <= sections and not any(
            isinstance(v, list) for v in data.values())
        if title == "config.yaml" or looks_like:
            yield block.where, block.text


def _name(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def rule_snippets(path: Path, root: Path = REPO) -> Iterator[tuple[Where, str]]:
    """The rule files a page shows: YAML blocks whose only key is `rules`, a list of named rules (a Kubernetes
    ClusterRole's `rules:` has no names)."""
    import yaml

    for block in blocks(path, root):
        if block.lang not in ("yaml", "yml"):
            continue
        try:
            data = yaml.safe_load(block.text)
        except yaml.YAMLError:
            continue
        if isinstance(data, dict) and set(data) == {"rules"} and isinstance(data["rules"], list) and all(
                isinstance(r, dict) and "name" in r for r in data["rules"]):
            yield block.where, block.text
