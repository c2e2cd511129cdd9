"""Every rule file README.md and docs/*.md show passes `gpuevents rules check`: its keys, its condition's names
and fields, and its actions' parameters rendered against a sample entity."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gpuevents.cli import app
from tests.docs.snippets import doc_files, rule_snippets


def check(text: str, where: Path) -> tuple[int, str]:
    where.write_text(text)
    result = CliRunner().invoke(app, ["rules", "check", str(where)])
    return result.exit_code, result.output


def test_every_documented_rule_file_passes_rules_check(tmp_path: Path) -> None:
    snippets = [s for f in doc_files() for s in rule_snippets(f)]
    assert len(snippets) >= 6, len(snippets)
    failed = []
    for i, (where, text) in enumerate(snippets):
        code, output = check(text, tmp_path / f"rules{i}.yaml")
        if code != 0:
            failed.append(f"{where}: gpuevents rules check: {output.strip()}")
    assert not failed, "\n".join(failed)


def test_a_rule_snippet_with_a_wrong_field_fails_and_a_cluster_role_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n")
    (tmp_path / "docs" / "page.md").write_text(
        "```yaml\nrules:\n  - {apiGroups: [\"\"], resources: [pods], verbs: [get]}\n```\n\n"
        "```yaml\nrules:\n  - name: r\n    entity: gpu\n    when: gpu.idel\n    actions: [{type: log}]\n```\n")
    found = [s for f in doc_files(tmp_path) for s in rule_snippets(f, tmp_path)]
    assert [str(w) for w, _ in found] == ["docs/page.md:6"]
    code, output = check(found[0][1], tmp_path / "r.yaml")
    assert code == 1 and "idel" in output
