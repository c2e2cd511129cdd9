"""A reload with changed rules: a description or label edit keeps the open incidents; a real change or a removal
closes them through the normal path, with a reason, the OLD rule's on_resolve and the closed incident to persist
(a restart with changed rules: tests/rules/core/test_recovery.py)."""

from __future__ import annotations

from pathlib import Path

from rules.core.core import Core, Tick
from rules.lang.loader import rule_hash
from tests.rules.helpers import OTHER, SCALE, at, gpu, held, proc, rules_from, scale_rules, snapshot


def test_the_hash_leaves_out_description_and_labels(tmp_path: Path) -> None:
    a = scale_rules(tmp_path).rules[0]
    b = scale_rules(tmp_path, description="new words", severity="critical").rules[0]
    c = rules_from(tmp_path, SCALE.format(description="x", severity="info").replace("replicas: 0", "replicas: 1"))
    assert a.hash == b.hash == rule_hash(b.spec, "UTC") and c.rules[0].hash != a.hash
    assert a.legacy_hash != b.legacy_hash  # what earlier engines stored: still accepted on restore


def test_editing_only_the_description_keeps_the_firing_incident(tmp_path: Path) -> None:
    core = Core(scale_rules(tmp_path))
    core.step(held(0), at(0))
    (firing,) = core.open_incidents()
    out = core.replace_rules(scale_rules(tmp_path, description="new words", severity="warning"), at(10))
    assert out.transitions == [] and out.actions == [] and out.incidents == []
    assert core.open_incidents() == [firing]
    # the edit shows at the next send: on_resolve renders the new description
    out = core.step(snapshot(at(20), gpus=[gpu(0, 90)], processes=[proc(42)]), at(20))
    assert [(a.type, a.params.get("replicas") or a.params.get("message")) for a in out.actions] == [
        ("scale", "previous"), ("log", "new words")]
    assert out.actions[0].rule_labels == {"severity": "warning"}


def test_a_changed_rule_closes_its_incidents_with_the_old_rules_on_resolve(tmp_path: Path) -> None:
    core = Core(scale_rules(tmp_path))
    core.step(held(0), at(0))
    changed = tmp_path / "changed"
    changed.mkdir()
    new = rules_from(changed, SCALE.format(description="new", severity="info")
                     .replace("gpu.idle and gpu.processes", "gpu.idle")
                     .replace('message: "{{ rule.description }}"', "message: new-resolve"))
    out = core.replace_rules(new, at(10))
    assert [(t.from_status, t.to_status, t.reason) for t in out.transitions] == [("firing", "resolved", "rule_changed")]
    assert [(a.phase, a.type, a.params.get("replicas") or a.params.get("message"),
             a.decision) for a in out.actions] == [
        ("resolve", "scale", "previous", "run"), ("resolve", "log", "old words", "run")]  # the OLD rule's on_resolve
    (closed,) = out.incidents
    assert (closed.status, closed.resolve_reason, closed.resolved_at) == ("resolved", "rule_changed", at(10))
    assert core.open_incidents() == []
    out = core.step(Tick(), at(20))  # the new rule is evaluated in full: a new incident
    assert [t.to_status for t in out.transitions] == ["pending", "firing"]
    assert out.incidents[-1].id != closed.id and out.incidents[-1].rule_hash == new.rules[0].hash


def test_a_removed_rule_closes_its_incidents_and_the_others_stay(tmp_path: Path) -> None:
    core = Core(scale_rules(tmp_path, extra=OTHER))
    core.step(held(0), at(0))
    kept = [i for i in core.open_incidents() if i.rule == "other"]
    out = core.replace_rules(rules_from(tmp_path, "rules:\n" + OTHER,
                                        name="only.yaml"), at(30))
    assert [(t.rule, t.to_status, t.reason) for t in out.transitions] == [("scale-down", "resolved", "rule_removed")]
    assert [(a.rule, a.type) for a in out.actions] == [("scale-down", "scale"), ("scale-down", "log")]
    assert [i.status for i in out.incidents] == ["resolved"] and core.open_incidents() == kept
    assert core.limiter.matching_count("scale-down") == 0


def test_a_pending_incident_of_a_changed_rule_becomes_inactive_without_actions(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, SCALE.format(description="d", severity="info").replace(
        "    labels:", "    for: 1h\n    labels:")))
    core.step(held(0), at(0))
    out = core.replace_rules(scale_rules(tmp_path), at(10))
    assert [(t.from_status, t.to_status, t.reason) for t in out.transitions] == [("pending", "inactive",
                                                                                  "rule_changed")]
    assert out.actions == []


def test_a_changed_rule_is_evaluated_at_the_very_next_tick(tmp_path: Path) -> None:
    core = Core(scale_rules(tmp_path))
    core.step(held(0), at(0))
    core.step(Tick(), at(1))  # a sweep: the next one would be `engine.tick` later
    core.replace_rules(rules_from(tmp_path, SCALE.format(description="d", severity="info").replace(
        "gpu.idle and gpu.processes", "gpu.idle")), at(2))
    assert core.next_wakeup(at(2)) == at(2)
    assert [t.to_status for t in core.step(Tick(), at(3)).transitions] == ["pending", "firing"]
