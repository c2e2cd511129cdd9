"""`rules check`: every action's templates rendered against a sample entity of the rule's kind; one that does
not render is a problem at its file and line naming the rule, the section and the action; the engine loads
through the same check, so a set `rules check` rejects never runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuevents.yamlpos import LocatedError
from rules.intake.check import check_paths, load_checked, sample_entities

GOOD = """\
rules:
  - name: idle
    entity: gpu
    when: gpu.idle and gpu.processes
    actions: [{type: log, message: "GPU {{ gpu.index }} on {{ node.name }} held by {{ gpu.owner }}"}]
  - name: long-job
    entity: process
    when: process.gpus
    actions: [{type: log, message: "{{ process.user }} {{ process.name }}"}]
"""
BAD = """\
rules:
  - name: idle
    entity: gpu
    when: gpu.idle
    actions:
      - type: log
        message: "fine"
    on_resolve:
      - type: log
        message: "{{ gpu.index // 0 }}"
"""


def test_a_set_whose_templates_render_has_no_problem(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(GOOD)
    rules, problems = check_paths([tmp_path / "r.yaml"])
    assert problems == [] and rules is not None and [r.name for r in rules] == ["idle", "long-job"]
    assert [r.name for r in load_checked([tmp_path / "r.yaml"])] == ["idle", "long-job"]


def test_a_template_that_does_not_render_is_a_problem_at_its_line(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    f.write_text(BAD)
    rules, problems = check_paths([f])
    assert rules is not None
    [p] = problems
    assert (p.file, p.line) == (str(f), 9)
    assert p.message.startswith("idle: on_resolve[0] (log) does not render for a sample gpu: ZeroDivisionError")
    with pytest.raises(LocatedError, match="does not render"):
        load_checked([f])


def test_a_file_that_does_not_load_gives_its_problems_and_no_rules(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    f.write_text("rules:\n  - name: x\n    entity: gpuu\n    when: true\n    actions: [{type: log, message: m}]\n")
    rules, problems = check_paths([f])
    assert rules is None and problems and all(p.file == str(f) for p in problems)


def test_there_is_a_sample_of_every_entity_kind() -> None:
    assert set(sample_entities()) >= {"gpu", "process", "node", "job"}
