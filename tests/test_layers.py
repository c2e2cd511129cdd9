"""The sub-layers of rules/, read from the source's own imports (lazy and TYPE_CHECKING ones included): lang <- core
<- {engine, offline}; intake imports only lang and core and the engine uses it; usage and dashboard import no core,
engine or offline (the dashboard may use usage); the engine does not import offline; no import circles in rules/."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBS = ("lang", "core", "intake", "engine", "offline", "usage", "dashboard")
# what each sub-package of rules/ may import of the others
ALLOWED: dict[str, frozenset[str]] = {
    "lang": frozenset(),
    "core": frozenset({"lang"}),
    "intake": frozenset({"lang", "core"}),
    "engine": frozenset({"lang", "core", "intake", "usage", "dashboard"}),
    "offline": frozenset({"lang", "core", "intake", "usage"}),  # never the engine: the shells share intake
    "usage": frozenset({"lang"}),
    "dashboard": frozenset({"lang", "usage"}),
}
CIRCLES_CHECKED_UNDER = ("rules.lang", "rules.core", "rules.intake", "rules.engine", "rules.offline",
                         "rules.usage", "rules.dashboard")


def modules(root: Path, package: str = "rules") -> dict[str, Path]:
    """Module name -> file, for every module under `root/package`."""
    out = {}
    for f in sorted((root / package).rglob("*.py")):
        name = ".".join(f.relative_to(root).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out


def imports(root: Path, package: str = "rules") -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports (resolved to the module, not the name inside it)."""
    mods = modules(root, package)

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
            for t in targets:
                r = resolve(t) if t.split(".")[0] == package else None
                if r is not None and r != name:
                    found.add(r)
        graph[name] = found
    return graph


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
