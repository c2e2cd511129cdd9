"""`gpuevents config check`: a valid file is ok; a key of `engine.limits` that names no action type (a typo that
would silently remove a safety limit) is an error with its file and line, listing the known types."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gpuevents.cli import app
from gpuevents.cli.configcheck import unknown_limit_types
from gpuevents.config import Config


def test_a_valid_file_is_ok(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("engine:\n  limits:\n    kill: {max_per_hour: 5}\n    cordon: {max_fleet_pct: 10}\n")
    result = CliRunner().invoke(app, ["config", "check", "-c", str(f)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"{f}: ok"


def test_a_typo_in_a_fleet_limit_is_an_error_not_a_missing_limit(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("engine:\n  limits:\n    kil: {max_per_hour: 5}\n    kill: {max_per_hour: 5}\n")
    result = CliRunner().invoke(app, ["config", "check", "-c", str(f)])
    assert result.exit_code == 1
    assert f"{f}:3: engine.limits.kil: unknown action type" in result.output
    assert "engine.limits.kill:" not in result.output


def test_limits_from_the_environment_are_checked_without_a_file() -> None:
    cfg = Config.model_validate({"engine": {"limits": {"cordonn": {"max_per_hour": 1}}}})
    [problem] = unknown_limit_types(cfg, None)
    assert (problem.file, problem.message.split(";")[0]) == ("<env>", "engine.limits.cordonn: unknown action type")
    assert "cordon" in str(problem) and "kill" in str(problem)
    assert unknown_limit_types(Config(), None) == []
