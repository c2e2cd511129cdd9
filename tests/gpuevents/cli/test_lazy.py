"""`gpuevents.cli.lazy`: the verb table lists every command truly, and help imports no runtime (bus, rules)."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from gpuevents.cli import app
from gpuevents.cli.lazy import VERBS, load_verb

# Modules that a command's help has no need of: the bus and its client (nats pulls aiohttp), the rules core.
RUNTIME = ("nats", "aiohttp", "gpuevents.bus", "rules.core", "rules.engine", "rules.usage")


def loaded_after(code: str) -> list[str]:
    """The RUNTIME modules in sys.modules after a fresh interpreter runs `code`."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {RUNTIME!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_importing_the_cli_loads_no_runtime() -> None:
    assert loaded_after("import gpuevents.cli") == []


@pytest.mark.parametrize("args", [["--help"], ["status", "--help"], ["snooze", "--help"], []])
def test_help_loads_no_runtime(args: list[str]) -> None:
    code = ("from typer.testing import CliRunner\nfrom gpuevents.cli import app\n"
            f"r = CliRunner().invoke(app, {args!r})\nassert 'Usage' in r.output, r.output")
    assert loaded_after(code) == []


def test_every_summary_is_the_first_paragraph_of_the_commands_help() -> None:
    for name, verb in VERBS.items():
        command = load_verb(name)
        assert command.name == name
        first = (command.help or "").split("\n\n")[0]
        assert " ".join(verb.summary.split()) == " ".join(first.split()), name


def test_the_table_names_every_command_a_module_registers() -> None:
    listed: dict[str, set[str]] = defaultdict(set)
    for name, verb in VERBS.items():
        if verb.given_by == "register":
            listed[verb.module].add(name)
    for module_name, names in listed.items():
        holder = typer.Typer()
        __import__(module_name, fromlist=["register"]).register(holder)
        assert set(typer.main.get_group(holder).commands) == names, module_name


def test_the_top_help_lists_every_verb_and_a_verb_runs() -> None:
    runner = CliRunner()
    top = runner.invoke(app, ["--help"], terminal_width=200)
    assert top.exit_code == 0
    for name in VERBS:
        assert f" {name} " in top.output, name
    sub = runner.invoke(app, ["rules", "check", "--help"])
    assert sub.exit_code == 0 and "Validate rule files" in sub.output
    unknown = runner.invoke(app, ["nope"])
    assert unknown.exit_code == 2 and "No such command" in unknown.output
