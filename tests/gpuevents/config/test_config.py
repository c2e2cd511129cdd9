"""Configuration: the example documents every key, errors say file:line: key, env overrides, no secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from gpuevents.cli import app
from gpuevents.config import Config, load_config
from gpuevents.yamlpos import LocatedError

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "config.example.yaml"


def _model_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        out.append(path)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.extend(_model_paths(ann, path))
    return out


def test_the_example_config_is_valid() -> None:
    result = CliRunner().invoke(app, ["config", "check", "-c", str(EXAMPLE)])
    assert result.exit_code == 0, result.output


def test_the_example_documents_every_key() -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    missing = []
    for path in _model_paths(Config):
        node = data
        for key in path:
            if not isinstance(node, dict) or key not in node:
                missing.append(".".join(path))
                break
            node = node[key]
    assert missing == []


def test_a_wrong_type_names_file_line_and_key(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("cluster: c1\nengine:\n  tick: 30s\n  dry_run: maybe\n")
    result = CliRunner().invoke(app, ["config", "check", "-c", str(f)])
    assert result.exit_code == 1
    assert f"{f}:4: engine.dry_run:" in result.output


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("engine:\n  tick: soon\nagent:\n  sampler: gpu\n  colour: red\n")
    with pytest.raises(LocatedError) as e:
        load_config(f)
    lines = sorted(str(p) for p in e.value.problems)
    assert any(f"{f}:2: engine.tick: must be a duration" in s for s in lines)
    assert any(f"{f}:4: agent.sampler:" in s for s in lines)
    assert any(f"{f}:5: agent.colour: unknown key" in s for s in lines)


def test_bad_yaml_gives_its_line(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("cluster: c1\nengine:\n  tick: [30s\n")
    with pytest.raises(LocatedError) as e:
        load_config(f)
    assert str(e.value).startswith(f"{f}:")
    assert "invalid YAML" in str(e.value)


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("cluster: c1\nengine:\n  tick: 30s\n")
    cfg = load_config(f, env={"GPUEVENTS_ENGINE__TICK": "5s", "GPUEVENTS_CLUSTER": "prod",
                              "GPUEVENTS_AGENT__THRESHOLDS__IDLE_UTIL_PCT": "7",
                              "GPUEVENTS_NATS__URL": "[nats://a:4222, nats://b:4222]"})
    assert cfg.engine.tick == 5
    assert cfg.cluster == "prod"
    assert cfg.agent.thresholds.idle_util_pct == 7
    assert cfg.nats.servers == ["nats://a:4222", "nats://b:4222"]


def test_a_bad_environment_value_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(LocatedError) as e:
        load_config(None, env={"GPUEVENTS_ENGINE__TICK": "often"})
    assert "GPUEVENTS_ENGINE__TICK" in str(e.value)


def test_secrets_in_the_file_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("actions:\n  slack:\n    token: xoxb-123\n")
    with pytest.raises(LocatedError) as e:
        load_config(f)
    assert f"{f}:3: actions.slack.token: secrets never go in the config file" in str(e.value)


def test_slack_token_comes_from_env_or_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text("xoxb-file\n")
    cfg = load_config(None, env={"GPUEVENTS_ACTIONS__SLACK__TOKEN_FILE": str(token_file)})
    assert cfg.actions.slack.token() == "xoxb-file"
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-env")
    assert cfg.actions.slack.token() == "xoxb-env"


def test_an_unknown_timezone_is_an_error(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("engine:\n  timezone: Mars/Olympus\n")
    with pytest.raises(LocatedError, match=r"c.yaml:2: engine.timezone: unknown timezone"):
        load_config(f)


def test_a_zero_tick_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("engine:\n  tick: 0s\n")
    with pytest.raises(LocatedError, match=r"c.yaml:2: engine.tick: must be greater than 0s"):
        load_config(f)
