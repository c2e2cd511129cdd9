"""Restart recovery: restored incidents resume, wait for their entity, or close when their rule changed or went."""

from __future__ import annotations

from pathlib import Path

from gpuevents.events import AgentInfo, GpuInfo, make_event
from rules.core.core import Core, Tick
from rules.lang.loader import load_rule_set
from tests.rules.helpers import IDLE, OTHER, SCALE, at, config, held, held_idle, rules_from, scale_rules


def test_restart_resumes_pending_and_does_not_fire_again(tmp_path: Path) -> None:
    rules = rules_from(tmp_path, IDLE.format(extra="for: 2h"))
    core = Core(rules)
    core.step(held_idle(), at(0))
    saved = core.open_incidents()
    assert [i.status for i in saved] == ["pending"]
    restarted = Core(rules)
    restarted.restore(saved, now=at(3600))
    restarted.step(held_idle(3600), at(3600))
    assert restarted.open_incidents() == saved  # still pending since 0, not since the restart
    restarted.step(held_idle(7190), at(7190))
    out = restarted.step(Tick(), at(7200))
    assert [t.to_status for t in out.transitions] == ["firing"]
    fired = restarted.open_incidents()
    again = Core(rules)
    again.restore(fired, now=at(7300))
    out = again.step(held_idle(7300), at(7300))
    assert out.actions == [] and again.open_incidents() == fired


def test_restored_incidents_of_entities_that_never_return_resolve_after_the_grace(tmp_path: Path) -> None:
    rules = rules_from(tmp_path, IDLE.format(extra=""))
    core = Core(rules)
    core.step(held_idle(), at(0))
    restarted = Core(rules, config(offline_grace="10m"))
    restarted.restore(core.open_incidents(), now=at(60))
    assert restarted.step(Tick(), at(120)).transitions == []
    out = restarted.step(Tick(), at(60 + 600))
    assert [(t.to_status, t.reason) for t in out.transitions] == [("resolved", "gone")]


def test_a_restart_with_a_changed_rule_closes_the_restored_incident_once_its_entity_is_seen(tmp_path: Path) -> None:
    core = Core(scale_rules(tmp_path))
    core.step(held(0), at(0))
    saved = core.open_incidents()
    (tmp_path / "rules.yaml").write_text(SCALE.format(description="d", severity="info").replace(
        "gpu.idle and gpu.processes", "gpu.idle"))
    restarted = Core(load_rule_set([tmp_path / "rules.yaml"]))
    restarted.restore(saved, now=at(60))
    assert restarted.step(Tick(), at(60)).transitions == []  # not seen yet
    restarted.step(held(70), at(70))
    out = restarted.step(Tick(), at(90))
    assert [(t.from_status, t.to_status, t.reason) for t in out.transitions] == [
        ("firing", "resolved", "rule_changed"), ("inactive", "pending", ""), ("pending", "firing", "")]
    assert [(a.phase, a.type) for a in out.actions] == [("resolve", "scale"), ("resolve", "log"), ("fire", "scale")]


def test_a_restart_without_the_rule_closes_its_incidents_at_the_first_step(tmp_path: Path) -> None:
    core = Core(scale_rules(tmp_path, extra=OTHER))
    core.step(held(0), at(0))
    saved = core.open_incidents()
    restarted = Core(rules_from(tmp_path, "rules:\n" + OTHER, name="other.yaml"))
    restarted.restore(saved, now=at(60))
    out = restarted.step(Tick(), at(60))
    assert [(t.rule, t.to_status, t.reason) for t in out.transitions] == [("scale-down", "resolved", "rule_removed")]
    assert [(i.rule, i.status) for i in out.incidents] == [("scale-down", "resolved")]
    assert [i.rule for i in restarted.open_incidents()] == ["other"]


def test_incidents_stored_with_the_hash_of_earlier_engines_restore_unchanged(tmp_path: Path) -> None:
    rules = scale_rules(tmp_path)
    core = Core(rules)
    core.step(held(0), at(0))
    legacy = [i.model_copy(update={"rule_hash": rules.rules[0].legacy_hash}) for i in core.open_incidents()]
    restarted = Core(rules)
    restarted.restore(legacy, now=at(60))
    restarted.step(held(70), at(70))
    out = restarted.step(Tick(), at(90))
    assert out.transitions == [] and out.actions == []
    assert [i.status for i in restarted.open_incidents()] == ["firing"]


def test_events_before_a_nodes_first_snapshot_leave_its_restored_incidents_alone(tmp_path: Path) -> None:
    """After a restart, a gpu.idle, process.started or agent.started from a node not seen since must not close
    its restored incidents as gone (which then reopened with a new id and ran the actions again)."""
    rules = rules_from(tmp_path, IDLE.format(extra=""))
    core = Core(rules)
    core.step(held_idle(), at(0))
    fired = core.open_incidents()
    assert [i.status for i in fired] == ["firing"]
    restarted = Core(rules)
    restarted.restore(fired, now=at(60))
    idle = make_event("gpu.idle", "n1", GpuInfo(node="n1", index=0, util_pct=0, idle=True, pids=[42]), time=at(61))
    started = make_event("agent.started", "n1", AgentInfo(node="n1"), time=at(62))
    for i, e in enumerate((idle, started)):
        out = restarted.step(e, at(61 + i))
        assert out.transitions == [] and out.actions == []
    out = restarted.step(Tick(), at(70))
    assert out.transitions == [] and restarted.open_incidents() == fired
    out = restarted.step(held_idle(75), at(75))  # the node's next snapshot
    assert out.actions == [] and restarted.open_incidents() == fired


def test_a_keep_stored_while_no_engine_ran_is_cut_to_snooze_max_at_restore(tmp_path: Path) -> None:
    from rules.core.core import Snooze

    rules = rules_from(tmp_path, IDLE.format(extra="snooze_max: 8h"))
    core = Core(rules)
    keep = Snooze(rule="idle", entity_id="n1/gpu0", until=at(30 * 86400), by="alice", bounded=True)
    snooze = Snooze(rule="idle", entity_id="n1/gpu1", until=at(30 * 86400), by="ops")
    core.restore([], [keep, snooze], now=at(3600))
    assert core.snoozes[("idle", "n1/gpu0")].until == at(3600 + 8 * 3600)  # a keep: at most the rule's 8h
    assert core.snoozes[("idle", "n1/gpu1")].until == at(30 * 86400)  # an operator's snooze: as given
    again = Core(rules)
    again.restore([], [core.snoozes[("idle", "n1/gpu0")]], now=at(7200))
    assert again.snoozes[("idle", "n1/gpu0")].until == at(3600 + 8 * 3600)  # a restart never lengthens it
