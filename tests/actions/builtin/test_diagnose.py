"""The `diagnose` action end to end: the runner, a real nats-server, the agent's diagnose service as the agent
serves it, a real child standing in for `dcgmi diag`, and the result in the node's next snapshot."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from actions.runner import ActionRunner
from agent.core import NodeCore
from agent.diagnose import Diagnostics
from agent.inputs import NodeInputs
from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.config import ThresholdsConfig
from gpuevents.diagnose import DIAGNOSE_VERB, AgentDiagnosticsConfig
from gpuevents.events import SnapshotEvent, make_event
from rules.intake.decoder import decode
from tests.actions.conftest import make_config, make_request
from tests.agent.test_diagnose import FAKE_DCGMI

HOSTILE = "$(touch pwned); `touch pwned` --fail"


@pytest.fixture
async def agent(bus: Bus, tmp_path: Path) -> AsyncIterator[Diagnostics]:
    """Node n1's agent with a diagnostic configured, its service subscribed as the agent subscribes it."""
    script = tmp_path / "fake_dcgmi.py"
    script.write_text(FAKE_DCGMI)
    argv = [sys.executable, str(script), "diag", "-r", "2", "--record", str(tmp_path / "ran.json")]
    d = Diagnostics(AgentDiagnosticsConfig(argv=argv, timeout=30))
    sub = await bus.serve(S.command_subject("default", "n1", DIAGNOSE_VERB), d.answer, concurrency=1,
                          what="diagnose command")
    yield d
    await sub.unsubscribe()
    await d.close()


async def test_a_rule_s_diagnose_runs_the_configured_argv_whatever_the_event_said(
        bus: Bus, agent: Diagnostics, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    facts = {"gpu": {"index": 0, "uuid": HOSTILE, "model": HOSTILE},
             "processes": [{"pid": 4242, "create_time": "2026-04-01T12:00:00+00:00", "user": HOSTILE,
                            "name": HOSTILE}]}
    record = await ActionRunner(bus, make_config()).process(make_request(
        "diagnose", facts=facts, rule="gpu-health-quarantine", key=f"inc-9:stage:{HOSTILE}"))
    assert record.outcome == "ok", record
    assert record.detail == "diagnostic on n1 started"
    result = await agent.wait()
    assert result is not None and result.status == "passed"  # `--fail` in the event did not reach it
    ran = json.loads((tmp_path / "ran.json").read_text())
    assert ran["argv"] == [str(tmp_path / "fake_dcgmi.py"), "diag", "-r", "2", "--record", str(tmp_path / "ran.json")]
    assert not (tmp_path / "pwned").exists()
    # the result rides on the node's next snapshot
    core = NodeCore(node="n1", cluster="default", thresholds=ThresholdsConfig(), snapshot_interval_s=15)
    core.inputs = NodeInputs(diag_fields=agent.fields)  # as the agent's runner hands it in
    info = core.node_info()
    assert (info.diag_status, info.diag_exit_code, info.diag_passed_at) == ("passed", 0, result.finished_at)
    assert info.diag_output is not None and info.diag_output.endswith("Diagnostic result: Pass\n")
    # and the engine reads it from the stream as the agent published it
    snap = core.snapshot(datetime.now(UTC))
    raw = make_event("node.snapshot", "n1", snap).model_dump_json().encode()
    decoded = decode(raw)
    assert isinstance(decoded, SnapshotEvent)
    node = decoded.data.node
    assert (node.diag_status, node.diag_exit_code, node.diag_passed_at) == ("passed", 0, result.finished_at)


async def test_a_node_without_a_diagnostic_refuses_and_the_audit_says_why(bus: Bus) -> None:
    d = Diagnostics(AgentDiagnosticsConfig())
    sub = await bus.serve(S.command_subject("default", "n2", DIAGNOSE_VERB), d.answer, concurrency=1,
                          what="diagnose command")
    try:
        record = await ActionRunner(bus, make_config()).process(
            make_request("diagnose", entity_kind="node", entity_id="n2", node="n2"))
    finally:
        await sub.unsubscribe()
    assert record.outcome == "refused", record
    assert record.detail == ("diagnostic on n2 refused (no diagnostic configured on this node "
                             "(agent.diagnostics.argv))")
