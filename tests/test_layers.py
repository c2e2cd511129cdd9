"""The layers, read from the source's own imports (lazy, TYPE_CHECKING and by-string ones included): every import
of gpuevents, rules, actions, agent and nats against the table of docs/architecture.md ("What may import what");
and within rules/: lang <- core <- {engine, offline}; intake imports only lang and core and the engine uses it;
usage and dashboard import no core, engine or offline (the dashboard may use usage); the engine does not import
offline; no import circles in rules/ or actions/."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("gpuevents", "rules", "actions", "agent")
THIRD_PARTY = ("nats",)  # the third-party packages the table rules on
SUBS = ("lang", "core", "intake", "engine", "offline", "usage", "dashboard", "history")
CIRCLES_CHECKED_UNDER = ("rules.lang", "rules.core", "rules.intake", "rules.engine", "rules.offline",
                         "rules.usage", "rules.dashboard")


def read_table(doc: Path) -> dict[str, frozenset[str]]:
    """The table under "What may import what": package row (`rules/core`) -> what it may import (`gpuevents`,
    `actions/registry`, ...), each a path without its trailing slash. Raises ValueError, naming the line, on a
    row it cannot read."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("## What may import what"))
    table: dict[str, frozenset[str]] = {}
    for n, line in enumerate(lines[start + 1:], start + 2):
        if line.startswith("## "):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) < 2 or cells[0] in ("package", "---"):
            continue
        row = re.fullmatch(r"`([\w/]+?)/?`", cells[0])
        entries = re.findall(r"`([^`]+)`", cells[1])
        if row is None or re.sub(r"`[^`]+`|[,\s]|\band\b", "", cells[1]):
            raise ValueError(f"{doc}:{n}: a row is `package/` | `entry`, `entry`, ... | why; not {line!r}")
        table[row.group(1)] = frozenset(e.rstrip("/") for e in entries)
    if not table:
        raise ValueError(f"{doc}: no table under 'What may import what'")
    return table


TABLE = read_table(ROOT / "docs" / "architecture.md")
# what each sub-package of rules/ may import of the others: the table's rows for them
ALLOWED: dict[str, frozenset[str]] = {
    s: frozenset(e.split("/")[1] for e in TABLE[f"rules/{s}"] if e.startswith("rules/")) for s in SUBS}


def modules(root: Path, package: str = "rules") -> dict[str, Path]:
    """Module name -> file, for every module under `root/package`."""
    out = {}
    for f in sorted((root / package).rglob("*.py")):
        name = ".".join(f.relative_to(root).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out


def imports(root: Path, package: str = "rules") -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports (resolved to the module, not the name inside it)."""
    graph = tree_imports(root, (package,), strings=False)
    return {m: {t for t in targets if t.split(".")[0] == package} for m, targets in graph.items()}


def tree_imports(root: Path, packages: Iterable[str] = TOP, *, strings: bool = True) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports, resolved to the module (not the name inside it), and
    the THIRD_PARTY packages it imports by name; with `strings`, module paths named in strings
    (`"actions.builtin.kill"`, an import by name) count too."""
    packages = tuple(packages)
    mods: dict[str, Path] = {}
    for package in packages:
        mods.update(modules(root, package))

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, f in mods.items():
        here = name if f.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), str(f))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = here.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                named = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                targets = named + ([base] if len(named) < len(node.names) else [])  # a name inside `base`
            elif strings and isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and "." in node.value and node.value in mods:
                targets = [node.value]
            for t in targets:
                head = t.split(".")[0]
                r = resolve(t) if head in packages else head if head in THIRD_PARTY else None
                if r is not None and r != name:
                    found.add(r)
        graph[name] = found
    return graph


def row_of(module: str, table: dict[str, frozenset[str]]) -> str | None:
    """The table's row a module falls under: the longest package path that holds it."""
    path = module.replace(".", "/")
    rows = [r for r in table if path == r or path.startswith(r + "/")]
    return max(rows, key=len) if rows else None


def may_import(row: str, target: str, table: dict[str, frozenset[str]]) -> bool:
    """Whether a module of `row` may import `target`: its own row, a row it names, or a module (or group of
    rows) it names."""
    to = row_of(target, table)
    path = target.replace(".", "/")
    return to == row or any(e == to or (e not in table and (path == e or path.startswith(e + "/")))
                            for e in table[row])


def table_breaches(graph: dict[str, set[str]], table: dict[str, frozenset[str]]) -> list[str]:
    out = []
    for a, targets in sorted(graph.items()):
        row = row_of(a, table)
        if row is None:
            if a.count(".") > 0 or targets:  # a package marker that imports nothing needs no row
                out.append(f"{a}: in no row of the table")
            continue
        for b in sorted(targets):
            if not may_import(row, b, table):
                out.append(f"{a} imports {b}: {row}/ may import {', '.join(sorted(table[row]))}")
    return out


def sub(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in SUBS else None


def layer_breaches(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            sa, sb = sub(a), sub(b)
            if sa is not None and sb is not None and sa != sb and sb not in ALLOWED[sa]:
                out.append(f"{a} imports {b}: rules/{sa} may use only {sorted(ALLOWED[sa]) or 'no other'}")
    return out


def circles(graph: dict[str, set[str]], within: Iterable[str]) -> list[list[str]]:
    """The import circles (strongly connected components of more than one module) among modules under `within`."""
    prefixes = tuple(within)
    nodes = [m for m in graph if m.startswith(prefixes)]
    edges = {m: [t for t in graph[m] if t.startswith(prefixes)] for m in nodes}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in nodes:  # Tarjan's algorithm, iterative
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(edges[w])))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_every_import_in_the_tree_is_one_the_table_allows() -> None:
    assert table_breaches(tree_imports(ROOT), TABLE) == []


def test_every_row_and_entry_of_the_table_names_a_package_or_module() -> None:
    for name in [*TABLE, *(e for entries in TABLE.values() for e in entries)]:
        assert name in THIRD_PARTY or (ROOT / name).is_dir() or (ROOT / f"{name}.py").is_file(), name


def test_the_table_check_finds_a_breach_a_string_import_and_nats(tmp_path: Path) -> None:
    root = write(tmp_path, {
        "docs/architecture.md": "# x\n## What may import what\n| package | may import | why |\n| --- | --- | --- |\n"
                                "| `gpuevents/` | `gpuevents` | the contract |\n"
                                "| `gpuevents/bus/` | `gpuevents`, `nats` | |\n"
                                "| `rules/lang/` | `gpuevents`, `actions/registry` | the catalogue |\n"
                                "| `actions/` | `gpuevents`, `gpuevents/bus` | |\n## next\n| `agent/` | `rules` | |\n",
        "gpuevents/__init__.py": "",
        "gpuevents/a.py": "import nats\n",  # nats outside the bus
        "gpuevents/bus/__init__.py": "import nats.js\nfrom gpuevents import a\n",
        "rules/__init__.py": "",
        "rules/lang/__init__.py": "",
        "rules/lang/l.py": "def f():\n    from actions import registry, protection\n",  # lazy: counted
        "actions/__init__.py": "",
        "actions/registry.py": "BUILTIN = ['actions.protection']\n",
        "actions/protection.py": "import importlib\nimportlib.import_module('rules.lang.l')\n",  # by name
    })
    table = read_table(root / "docs" / "architecture.md")
    assert table == {"gpuevents": {"gpuevents"}, "gpuevents/bus": {"gpuevents", "nats"},
                     "rules/lang": {"gpuevents", "actions/registry"}, "actions": {"gpuevents", "gpuevents/bus"}}
    assert table_breaches(tree_imports(root), table) == [
        "actions.protection imports rules.lang.l: actions/ may import gpuevents, gpuevents/bus",
        "gpuevents.a imports nats: gpuevents/ may import gpuevents",
        "rules.lang.l imports actions.protection: rules/lang/ may import actions/registry, gpuevents"]


def test_a_table_row_with_words_where_entries_go_is_refused(tmp_path: Path) -> None:
    doc = write(tmp_path, {"a.md": "## What may import what\n| package | may import |\n| --- | --- |\n"
                                   "| `rules/x/` | `gpuevents`, never `agent` |\n"})
    with pytest.raises(ValueError, match=r"a\.md:4: a row is"):
        read_table(doc / "a.md")


def test_every_sub_package_imports_only_the_layers_below_it() -> None:
    assert layer_breaches(imports(ROOT)) == []


def test_both_shells_use_intake_and_intake_is_used_by_no_lower_layer() -> None:
    graph = imports(ROOT)
    assert any(sub(a) == "engine" and sub(b) == "intake" for a, bs in graph.items() for b in bs)
    assert any(sub(a) == "offline" and sub(b) == "intake" for a, bs in graph.items() for b in bs)
    assert not any(sub(a) in ("lang", "core") and sub(b) == "intake" for a, bs in graph.items() for b in bs)


def test_no_import_circles_in_rules() -> None:
    assert circles(imports(ROOT), CIRCLES_CHECKED_UNDER) == []


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_checks_find_a_breach_a_lazy_import_and_a_circle(tmp_path: Path) -> None:
    root = write(tmp_path, {
        "rules/__init__.py": "",
        "rules/core/__init__.py": "",
        "rules/core/a.py": "def f():\n    from rules.engine import b\n",  # lazy: counted too
        "rules/engine/__init__.py": "",
        "rules/engine/b.py": "from . import c\n",
        "rules/engine/c.py": "from rules.engine.b import x\nimport rules.lang.y\n",
        "rules/lang/__init__.py": "",
        "rules/lang/y.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rules.usage import z\n",
        "rules/usage/__init__.py": "",
        "rules/usage/z.py": "",
    })
    graph = imports(root)
    assert graph["rules.engine.b"] == {"rules.engine.c"} and graph["rules.engine.c"] == {"rules.engine.b",
                                                                                         "rules.lang.y"}
    assert layer_breaches(graph) == [
        "rules.core.a imports rules.engine.b: rules/core may use only ['lang']",
        "rules.lang.y imports rules.usage.z: rules/lang may use only no other"]
    assert circles(graph, ["rules.engine"]) == [["rules.engine.b", "rules.engine.c"]]


def test_no_import_circles_in_actions() -> None:
    # Slack's button ids and labels live with the message (slack_format), which the clicks read, not the reverse
    assert circles(imports(ROOT, "actions"), ["actions"]) == []
