"""MkDocs hooks (mkdocs.yml `hooks:`): the reference pages and the changelog page are generated from the code and
CHANGELOG.md on every build, so they are never committed and never stale."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for where in (ROOT, ROOT / "scripts"):
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))

import docsref  # noqa: E402  (after the path above)
from mkdocs.structure.files import File, Files  # noqa: E402


def _changelog() -> str:
    return (ROOT / "CHANGELOG.md").read_text()


#: generated page (its path in the site) -> what writes it
PAGES: dict[str, Callable[[], str]] = {
    "reference/rules.md": docsref.rules_page,
    "reference/actions.md": docsref.actions_page,
    "reference/cli.md": docsref.cli_page,
    "reference/configuration.md": docsref.config_page,
    "changelog.md": _changelog,
}


def on_files(files: Files, config: Any) -> Files:
    for uri, write in PAGES.items():
        files.append(File.generated(config, uri, content=write()))
    return files
