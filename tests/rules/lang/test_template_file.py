"""`template: FILE` on a slack action: the file's content is the message, compiled and checked at load."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuevents.config import Config
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, make_event
from gpuevents.yamlpos import LocatedError
from rules.core.core import Core
from rules.intake.check import check_paths
from rules.lang.loader import load_rule_set

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)

RULE = """\
rules:
  - name: idle-dm
    entity: gpu
    when: gpu.idle
    actions:
      - type: slack
        to: "#gpu"
        template: {template}
"""


def test_a_template_file_becomes_the_message(tmp_path: Path) -> None:
    (tmp_path / "msg.j2").write_text("GPU {{ gpu.index }} on {{ node.name }} is idle\n")
    (tmp_path / "r.yaml").write_text(RULE.format(template="msg.j2"))
    core = Core(load_rule_set([tmp_path / "r.yaml"]), Config())
    snap = NodeSnapshot(node=NodeInfo(name="n1"), gpus=[GpuInfo(node="n1", index=3, util_pct=0, idle=True)])
    result = core.step(make_event("node.snapshot", "n1", snap, time=T0), T0)
    assert [(a.type, a.params["text"]) for a in result.actions] == [("slack", "GPU 3 on n1 is idle\n")]
    assert "template" not in result.actions[0].params


def test_a_missing_template_file_is_a_load_error_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(RULE.format(template="nope.j2"))
    with pytest.raises(LocatedError) as e:
        load_rule_set([tmp_path / "r.yaml"])
    assert f"{tmp_path / 'r.yaml'}:8: template: cannot read" in str(e.value)


def test_a_typo_in_a_template_file_is_caught_by_rules_check(tmp_path: Path) -> None:
    (tmp_path / "msg.j2").write_text("GPU {{ gpu.indx }} idle\n")
    (tmp_path / "r.yaml").write_text(RULE.format(template="msg.j2"))
    _, problems = check_paths([tmp_path / "r.yaml"])
    assert any("indx" in str(p) and str(p).startswith(f"{tmp_path / 'r.yaml'}:") for p in problems), problems
