"""Every configuration snippet README.md and docs/*.md show passes `gpuevents config check`: a YAML block whose
top-level keys are config sections is a config file; a block titled `config.yaml: a.b` is a part of one that
lives under key a.b (see tests/docs/snippets.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuevents.cli import app
from gpuevents.config import Config
from tests.docs.snippets import config_snippets, doc_files

SECTIONS = frozenset(Config.model_fields)


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("GPUEVENTS_"):
            monkeypatch.delenv(name)


def check(text: str, where: Path) -> tuple[int, str]:
    where.write_text(text)
    result = CliRunner().invoke(app, ["config", "check", "-c", str(where)])
    return result.exit_code, result.output


def test_every_documented_config_snippet_passes_config_check(tmp_path: Path) -> None:
    snippets = [s for f in doc_files() for s in config_snippets(f, SECTIONS)]
    assert len(snippets) >= 6, len(snippets)
    failed = []
    for i, (where, text) in enumerate(snippets):
        code, output = check(text, tmp_path / f"snippet{i}.yaml")
        if code != 0:
            failed.append(f"{where}: gpuevents config check: {output.strip()}")
    assert not failed, "\n".join(failed)


def test_a_snippet_with_a_key_the_config_lacks_fails_naming_its_line(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n")
    (tmp_path / "docs" / "page.md").write_text(
        "# page\n\n```yaml\nengine:\n  dry_run: true\n  tick_every: 5s\n```\n\n"
        '```yaml title="config.yaml: actions.slack"\nadmins: [U1]\n```\n\n'
        "```yaml\nrules: []\n```\n")
    found = [s for f in doc_files(tmp_path) for s in config_snippets(f, SECTIONS, tmp_path)]
    assert [str(w) for w, _ in found] == ["docs/page.md:3", "docs/page.md:9"]
    code, output = check(found[0][1], tmp_path / "a.yaml")
    assert code == 1 and "tick_every" in output
    code, output = check(found[1][1], tmp_path / "b.yaml")
    assert code == 0, output
    assert found[1][1] == "actions:\n  slack:\n    admins: [U1]\n"
