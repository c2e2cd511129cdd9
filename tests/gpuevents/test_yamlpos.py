"""Untrusted YAML stays cheap: an alias bomb or an oversized file is refused with `file:line`, anchors still work.

The command-line tests run the real `gpuevents` in a child process, as an operator would."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuevents.yamlpos import MAX_ALIAS_NODES, MAX_YAML_BYTES, LocatedError, parse_scalar, parse_yaml


def alias_bomb(top: str = "rules") -> str:
    """The classic "billion laughs": nine levels of nine aliases each, 9^9 strings from a few hundred bytes."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + f"\n{top}: *i\n"


def test_the_alias_bomb_is_a_few_hundred_bytes_for_387_million_strings() -> None:
    assert len(alias_bomb()) < 618 and 9 ** 9 == 387_420_489


def test_an_alias_bomb_is_refused_with_its_line_at_once() -> None:
    started = time.perf_counter()
    with pytest.raises(LocatedError) as e:
        parse_yaml(alias_bomb(), "bomb.yaml")
    elapsed = time.perf_counter() - started
    (problem,) = e.value.problems
    assert problem.file == "bomb.yaml" and 2 <= problem.line <= 10
    assert f"aliases expand to more than {MAX_ALIAS_NODES:,} values" in problem.message
    print(f"alias bomb refused in {elapsed * 1000:.1f} ms")


def test_anchors_for_shared_settings_still_load() -> None:
    doc = parse_yaml("""\
defaults: &defaults {type: slack, to: "#gpu"}
rules:
  - {<<: *defaults, text: one}
  - *defaults
  - *defaults
""", "ok.yaml")
    assert doc.data["rules"] == [{"type": "slack", "to": "#gpu", "text": "one"},
                                 {"type": "slack", "to": "#gpu"}, {"type": "slack", "to": "#gpu"}]


def test_a_mapping_key_that_is_an_alias_to_a_collection_is_refused_before_it_is_built() -> None:
    with pytest.raises(LocatedError, match=r"k\.yaml:\d+: keys must be plain scalars"):
        parse_yaml("x: &x [1, 2]\n? *x\n: v\n", "k.yaml")


def test_an_environment_value_cannot_carry_an_alias_bomb() -> None:
    assert parse_scalar(alias_bomb("x")) == alias_bomb("x")  # refused as YAML: kept as the literal text
    assert parse_scalar("[a, b]") == ["a", "b"]


def gpuevents(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuevents.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("verb", [("rules", "check"), ("config", "check", "-c")], ids=["rules check", "config check"])
def test_the_command_line_refuses_an_alias_bomb_with_file_line_and_exit_1(tmp_path: Path,
                                                                            verb: tuple[str, ...]) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb("rules" if verb[0] == "rules" else "cluster"))
    result = gpuevents(*verb, str(bomb), cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout + result.stderr
    assert f"{bomb}:" in out and "aliases expand to more than" in out and "Traceback" not in out


def test_rules_test_refuses_a_rule_file_that_is_an_alias_bomb(tmp_path: Path) -> None:
    (tmp_path / "bomb.yaml").write_text(alias_bomb())
    spec = tmp_path / "bomb.test.yaml"
    spec.write_text("rule_files: [bomb.yaml]\ntests:\n  - name: t\n    snapshots: []\n    expect: []\n")
    result = gpuevents("rules", "test", str(spec), cwd=tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode in (1, 2) and "aliases expand to more than" in out and "Traceback" not in out, out


def test_a_rule_test_file_that_is_an_alias_bomb_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "bomb.test.yaml"
    spec.write_text(alias_bomb("tests"))
    result = gpuevents("rules", "test", str(spec), cwd=tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 2 and f"{spec}:" in out and "aliases expand" in out and "Traceback" not in out


def test_a_file_over_the_size_limit_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("rules: []\n" + "#" * MAX_YAML_BYTES + "\n")
    result = gpuevents("rules", "check", str(big), cwd=tmp_path)
    assert result.returncode == 1 and f"{big}: larger than 2 MiB" in result.stdout + result.stderr


def test_the_engine_refuses_an_alias_bomb_in_its_rules_before_it_connects(tmp_path: Path) -> None:
    from gpuevents.server import free_port

    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "bomb.yaml").write_text(alias_bomb())
    config = tmp_path / "config.yaml"
    config.write_text(f'nats: {{url: "nats://127.0.0.1:{free_port()}"}}\n'  # nothing listens there
                      f"engine: {{rules: [{rules}], usage_db: {tmp_path / 'u.sqlite'}}}\n")
    result = gpuevents("engine", "-c", str(config), cwd=tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 1 and f"{rules / 'bomb.yaml'}:" in out and "aliases expand" in out, out
