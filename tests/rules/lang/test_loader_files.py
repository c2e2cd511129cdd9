"""Rule files that are not text or not sane YAML are located errors, never tracebacks."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuevents.cli import app
from gpuevents.yamlpos import LocatedError
from rules.lang.loader import load_rule_set


def test_a_file_that_is_not_utf8_is_a_located_error(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_bytes(b"rules:\n  - name: x\n    description: caf\xff\n")
    with pytest.raises(LocatedError) as e:
        load_rule_set([f])
    assert str(e.value).startswith(f"{f}:3: not UTF-8 text")


def test_a_self_referencing_alias_is_a_located_error(tmp_path: Path) -> None:
    f = tmp_path / "loop.yaml"
    f.write_text("a: &a [*a]\nrules: []\n")
    with pytest.raises(LocatedError, match="invalid YAML"):
        load_rule_set([f])


def test_rules_check_prints_the_error_and_exits_1(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_bytes(b"rules: \xff\n")
    result = CliRunner().invoke(app, ["rules", "check", str(f)])
    assert result.exit_code == 1
    assert "not UTF-8 text" in result.output
    assert "Traceback" not in result.output
