"""The command action through the runner: an argv without a shell, its output kept and cut, a non-zero exit,
a timeout, a command that cannot start, a hostile value as one literal argument."""

from __future__ import annotations

import sys

from actions.registry import escape_for
from actions.runner import ActionRunner
from rules.lang.templates import compile_params, render_params
from tests.actions.conftest import make_config, make_request


async def test_command_runs_the_argv_without_a_shell_and_keeps_its_output() -> None:
    runner = await ActionRunner.open(None, make_config())
    record = await runner.process(make_request("command", {"argv": ["echo", "node n1; rm -rf / $(id)"]}))
    assert record.outcome == "ok"
    assert record.detail == "echo: exit 0; output: node n1; rm -rf / $(id)\n"


async def test_command_output_is_truncated_and_a_nonzero_exit_fails() -> None:
    runner = await ActionRunner.open(None, make_config(actions={"command_output_max": 20}))
    argv = [sys.executable, "-c", "print('x' * 500); raise SystemExit(3)"]
    record = await runner.process(make_request("command", {"argv": argv}))
    assert record.outcome == "failed" and record.attempt == 1
    assert record.error is not None and record.error.startswith(f"{sys.executable}: exit 3; output: " + "x" * 20)
    assert "481 more characters cut" in record.error


async def test_command_times_out_and_is_killed() -> None:
    runner = await ActionRunner.open(None, make_config())
    argv = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"]
    record = await runner.process(make_request("command", {"argv": argv, "timeout": 1.5}))
    assert record.outcome == "failed"
    assert record.error is not None and "timed out after" in record.error and "started" in record.error


async def test_command_that_cannot_start_fails_with_the_reason() -> None:
    record = await (await ActionRunner.open(None, make_config())).process(
        make_request("command", {"argv": ["/no/such/program"]}))
    assert record.outcome == "failed" and "cannot run '/no/such/program'" in (record.error or "")


def rendered(type_: str, params: dict[str, object], **names: object) -> dict[str, object]:
    """The parameters as the engine renders them: compiled with the action's escape, then rendered."""
    tree, errors = compile_params(params, "process", escape_for(type_))
    assert errors == []
    return render_params(tree, names)


async def test_command_argv_takes_a_hostile_value_as_one_literal_argument() -> None:
    hostile = '$(touch /tmp/gpuevents-pwned); x" ; rm -rf / #'
    params = rendered("command", {"argv": [sys.executable, "-c", "import sys; print(repr(sys.argv[1]))",
                                           "{{ process.name }}"]}, process={"name": hostile})
    record = await (await ActionRunner.open(None, make_config())).process(make_request("command", params))
    assert record.outcome == "ok" and repr(hostile) in (record.detail or "")
