"""The agent's `diagnose` command: the configured argv run as a real child process (a small script standing in
for `dcgmi diag`), its result kept for the node's snapshots, the timeout, and what is refused."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import pytest

from agent.diagnose import Diagnostics
from gpuevents.config import Config
from gpuevents.diagnose import AgentDiagnosticsConfig
from tests.waiting import wait_for

# Stands in for `dcgmi diag -r 2`: writes its argv to a file, prints a report, exits with the status asked.
FAKE_DCGMI = """\
import json, os, sys, time
args = sys.argv[1:]
out = args[args.index("--record") + 1]
with open(out, "w") as f:
    json.dump({"argv": sys.argv, "pid": os.getpid()}, f)
for i in range(2000):
    print(f"line {i}: Memory ....... Pass")
if "--hang" in args:
    print("hanging", flush=True)
    time.sleep(120)
print("Diagnostic result: " + ("Fail" if "--fail" in args else "Pass"), flush=True)
sys.exit(226 if "--fail" in args else 0)
"""


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 4, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        self.now += timedelta(minutes=1)
        return self.now


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "fake_dcgmi.py"
    p.write_text(FAKE_DCGMI)
    return p


def diagnostics(script: Path, tmp_path: Path, *extra: str, timeout: float = 30.0,
                tail: int = 200) -> Diagnostics:
    argv = [sys.executable, str(script), "diag", "-r", "2", "--record", str(tmp_path / "ran.json"), *extra]
    return Diagnostics(AgentDiagnosticsConfig(argv=argv, timeout=timeout, output_tail=tail), clock=Clock())


def recorded(tmp_path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((tmp_path / "ran.json").read_text())
    return data


async def test_a_passing_run_is_reported_with_its_time_exit_code_and_a_bounded_tail(
        script: Path, tmp_path: Path) -> None:
    d = diagnostics(script, tmp_path)
    assert d.fields() == {}  # nothing before the first run
    reply = d.handle(b'{"rule": "gpu-health-quarantine", "key": "inc-1:fire:3:0"}')
    assert reply.outcome == "started"
    assert d.fields()["diag_status"] == "running"
    result = await d.wait()
    assert result is not None and result.status == "passed" and result.exit_code == 0
    assert recorded(tmp_path)["argv"] == [str(script), "diag", "-r", "2", "--record", str(tmp_path / "ran.json")]
    assert result.output.endswith("Diagnostic result: Pass\n") and len(result.output) == 200
    f = d.fields()
    assert f["diag_status"] == "passed" and f["diag_passed_at"] == result.finished_at
    assert f["diag_failed_at"] is None and f["diag_exit_code"] == 0


async def test_a_failing_run_keeps_the_time_of_the_last_pass(script: Path, tmp_path: Path) -> None:
    d = diagnostics(script, tmp_path)
    d.handle(b"{}")
    passed = await d.wait()
    assert passed is not None and passed.status == "passed"
    d.config = d.config.model_copy(update={"argv": [*(d.config.argv or []), "--fail"]})
    assert d.handle(b"{}").outcome == "started"
    failed = await d.wait()
    assert failed is not None and failed.status == "failed" and failed.exit_code == 226
    assert failed.passed_at == passed.passed_at and failed.failed_at == failed.finished_at
    assert failed.failed_at is not None and passed.passed_at is not None and failed.failed_at > passed.passed_at
    assert "Diagnostic result: Fail" in failed.output


async def test_one_run_at_a_time(script: Path, tmp_path: Path) -> None:
    d = diagnostics(script, tmp_path, "--hang", timeout=60)
    first = d.handle(b"{}")
    second = d.handle(b"{}")
    assert (first.outcome, second.outcome) == ("started", "running")
    assert second.started_at == first.started_at
    await wait_for(lambda: (tmp_path / "ran.json").exists(), what="the child to start")
    pid = await wait_for(lambda: _pid(tmp_path), what="the child to record its pid")
    assert isinstance(pid, int) and psutil.pid_exists(pid)
    await d.close()  # the agent stops: the child goes with it
    assert not psutil.pid_exists(pid)


def _pid(tmp_path: Path) -> int | None:
    try:
        pid = recorded(tmp_path)["pid"]
    except ValueError:  # written but not complete yet
        return None
    return pid if isinstance(pid, int) else None


async def test_a_run_past_the_timeout_is_killed_and_failed(script: Path, tmp_path: Path) -> None:
    d = diagnostics(script, tmp_path, "--hang", timeout=1.0)
    d.handle(b"{}")
    result = await d.wait()
    assert result is not None and result.status == "failed"
    assert result.output.endswith("[gpuevents: killed after the timeout of 1s]")
    assert "hanging" in result.output
    pid = recorded(tmp_path)["pid"]
    assert isinstance(pid, int) and not psutil.pid_exists(pid)


async def test_a_program_that_cannot_start_fails(tmp_path: Path) -> None:
    d = Diagnostics(AgentDiagnosticsConfig(argv=[str(tmp_path / "no-such-dcgmi"), "diag"]), clock=Clock())
    assert d.handle(b"{}").outcome == "started"
    result = await d.wait()
    assert result is not None and result.status == "failed" and result.exit_code is None
    assert "cannot start" in result.output and "No such file" in result.output


async def test_refused_when_no_diagnostic_is_configured() -> None:
    d = Diagnostics(Config().agent.diagnostics)
    reply = d.handle(b'{"rule": "r"}')
    assert (reply.outcome, reply.reason) == ("refused", "no diagnostic configured on this node "
                                             "(agent.diagnostics.argv)")
    assert d.fields() == {}


async def test_nothing_from_the_command_reaches_the_argv(script: Path, tmp_path: Path) -> None:
    """A command naming a program is refused outright; what a rule or event put in `rule` and `key` is only
    logged, never passed to the diagnostic."""
    d = diagnostics(script, tmp_path)
    for hostile in ({"argv": ["sh", "-c", "touch pwned"]}, {"args": ["-r", "4"]}, {"rule": "r", "shell": True}):
        reply = d.handle(json.dumps(hostile).encode())
        assert reply.outcome == "refused" and reply.reason.startswith("malformed diagnose command: "), reply
    assert not (tmp_path / "ran.json").exists() and d.fields() == {}
    evil = "gpu0; touch pwned $(touch pwned2) `id` --fail"
    assert d.handle(json.dumps({"rule": evil, "key": evil}).encode()).outcome == "started"
    result = await d.wait()
    assert result is not None and result.status == "passed"  # `--fail` in the key did not reach the script
    argv = recorded(tmp_path)["argv"]
    assert argv == [str(script), "diag", "-r", "2", "--record", str(tmp_path / "ran.json")]
    assert not (tmp_path / "pwned").exists() and not (Path.cwd() / "pwned").exists()


def test_the_config_wants_a_list_argv_and_a_positive_timeout() -> None:
    c = Config.model_validate({"agent": {"diagnostics": {"argv": ["dcgmi", "diag", "-r", "2"], "timeout": "20m"}}})
    assert c.agent.diagnostics.argv == ["dcgmi", "diag", "-r", "2"] and c.agent.diagnostics.timeout == 1200
    bads: list[dict[str, object]] = [{"argv": "dcgmi diag -r 2"}, {"argv": []}, {"argv": ["dcgmi"], "timeout": 0},
                                     {"shell": True}]
    for bad in bads:
        with pytest.raises(ValueError):
            Config.model_validate({"agent": {"diagnostics": bad}})


async def test_the_result_outlives_a_restart_and_an_interrupted_run_counts_as_failed(
        script: Path, tmp_path: Path) -> None:
    state = Diagnostics.state_file(tmp_path / "state", "gpu node/1")
    assert state.name == "diagnostic-gpu_node_1.json"
    d = diagnostics(script, tmp_path)
    d.state = state
    d.handle(b"{}")
    passed = await d.wait()
    assert passed is not None and passed.status == "passed"
    again = Diagnostics(d.config, clock=Clock(), state=state)  # the agent started again
    assert again.fields() == d.fields()
    hanging = diagnostics(script, tmp_path, "--hang", timeout=60)
    hanging.state = state
    hanging.result = again.result
    hanging.handle(b"{}")
    await hanging.close()  # the agent stops during the run
    after = Diagnostics(d.config, clock=Clock(), state=state)
    assert after.result is not None and after.result.status == "failed"
    assert after.result.output == "[gpuevents: the agent stopped during the run]"
    assert after.result.passed_at == passed.passed_at  # the earlier pass is still known, and older
    assert after.result.failed_at is not None and passed.passed_at is not None
    state.write_text("{not json")
    assert Diagnostics(d.config, state=state).result is None
