"""The non-Kubernetes providers: Slurm's scontrol (as an argv, binary configurable) and `command`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from actions.runner import ActionRunner
from tests.actions.conftest import make_config, make_request


def fake_scontrol(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in `scontrol` that appends its argv as JSON to a file."""
    log = tmp_path / "calls.jsonl"
    script = tmp_path / "scontrol"
    script.write_text(f"#!{sys.executable}\nimport json, sys\n"
                      f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    script.chmod(0o755)
    return script, log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


async def test_slurm_drains_and_resumes_a_node_with_scontrol(tmp_path: Path) -> None:
    scontrol, log = fake_scontrol(tmp_path)
    runner = await ActionRunner.open(None, make_config(actions={"slurm": {"scontrol": str(scontrol)}}))
    drain = await runner.process(make_request("cordon", {"provider": "slurm", "reason": "idle; $(reboot)"},
                                              entity_kind="node", entity_id="gpu-07", node="gpu-07"))
    resume = await runner.process(make_request("uncordon", {"provider": "slurm"}, entity_id="gpu-07/gpu1",
                                               node="gpu-07"))
    assert (drain.outcome, resume.outcome) == ("ok", "ok")
    assert calls(log) == [["update", "NodeName=gpu-07", "State=DRAIN", "Reason=idle; $(reboot)"],
                          ["update", "NodeName=gpu-07", "State=RESUME"]]


async def test_scale_by_command_substitutes_the_count_and_restores_the_previous_one(tmp_path: Path) -> None:
    script, log = fake_scontrol(tmp_path)  # any program that records its argv will do
    runner = await ActionRunner.open(None, make_config())
    base = {"provider": "command", "name": "pool-a", "argv": [str(script), "resize", "pool-a", "{replicas}"]}
    down = await runner.process(make_request("scale", {**base, "replicas": 0, "current": 4}, rule="weekend"))
    up = await runner.process(make_request("scale", {**base, "replicas": "previous"}, rule="weekend"))
    assert (down.outcome, up.outcome) == ("ok", "ok")
    assert calls(log) == [["resize", "pool-a", "0"], ["resize", "pool-a", "4"]]


async def test_command_provider_needs_an_argv() -> None:
    record = await (await ActionRunner.open(None, make_config())).process(
        make_request("cordon", {"provider": "command"}, entity_kind="node", entity_id="n1"))
    assert record.outcome == "refused"
    assert "provider 'command' needs `argv`" in (record.error or "")


@pytest.mark.parametrize("node", ["gpu[01-99]", "a,b", "n 1", "-h"])
async def test_slurm_refuses_a_node_name_that_is_not_one_node(tmp_path: Path, node: str) -> None:
    scontrol, log = fake_scontrol(tmp_path)
    runner = await ActionRunner.open(None, make_config(actions={"slurm": {"scontrol": str(scontrol)}}))
    record = await runner.process(make_request("cordon", {"provider": "slurm"}, entity_kind="node",
                                               entity_id=node, node=node))
    assert record.outcome == "refused" and "not one node" in (record.error or record.detail or "")
    assert not log.exists()
