"""The rule plan: rules grouped by what runs them, replaced whole on a reload."""

from __future__ import annotations

from pathlib import Path

from rules.core.plan import RulePlan
from tests.rules.helpers import rules_from

RULES = """\
rules:
  - name: idle
    entity: gpu
    when: gpu.idle
    for: 2m
    actions: [{type: log, message: m}]
  - name: idle-long
    entity: gpu
    when: gpu.idle_for_s > 600
    actions: [{type: log, message: m}]
  - name: down
    entity: node
    when: not node.online
    actions: [{type: log, message: m}]
  - name: nightly
    entity: job
    when: job.idle
    schedule: "0 3 * * *"
    actions: [{type: log, message: m}]
"""


def test_rules_are_grouped_by_what_runs_them(tmp_path: Path) -> None:
    plan = RulePlan(rules_from(tmp_path, RULES))
    assert [r.name for r in plan.event_rules["gpu"]] == ["idle", "idle-long"]
    assert plan.event_rules["job"] == []  # scheduled: run at its cron instants only
    assert [r.name for r in plan.time_rules["gpu"]] == ["idle-long"] and plan.has_time_rules
    assert [r.name for r in plan.liveness_rules] == ["down"]
    assert [r.name for r in plan.timed] == ["idle"]
    plan.set(rules_from(tmp_path, RULES.split("  - name: idle-long")[0], name="fewer.yaml"))
    assert list(plan.by_name) == ["idle"] and not plan.has_time_rules and plan.liveness_rules == []
