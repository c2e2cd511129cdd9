"""The evaluation loop: snoozed? test (an error counts as false, reported once), look up the incident, advance;
the sweep's filters (offline nodes, entities evaluated since) are options of the same loop."""

from __future__ import annotations

from pathlib import Path

from rules.core.core import Core, Snooze, StepResult, Tick
from tests.rules.helpers import at, gpu, held_idle, idle_core, proc, rules_from, snapshot


def test_an_evaluation_error_counts_as_false_and_is_reported_once(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: tier
    entity: gpu
    when: node.labels.tier == 'gold'
    actions: [{type: log, message: m}]
"""))
    out = core.step(snapshot(at(0), gpus=[gpu(0), gpu(1)]), at(0))
    assert out.transitions == [] and len(out.errors) == 1 and "tier" in out.errors[0].message
    assert core.step(snapshot(at(10), gpus=[gpu(0), gpu(1)]), at(10)).errors == []
    assert sum(core.error_counts.values()) == 4


def test_snooze_resolves_and_expiry_lets_it_fire_again(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    core.step(held_idle(), at(0))
    out = core.step(Snooze(rule="idle", entity_id="n1/gpu0", until=at(3600)), at(10))
    assert [(t.to_status, t.reason) for t in out.transitions] == [("resolved", "snoozed")]
    assert core.step(held_idle(20), at(20)).transitions == []
    core.step(held_idle(3590), at(3590))
    out = core.step(Tick(), at(3600))
    assert [t.to_status for t in out.transitions] == ["pending", "firing"]


def test_one_loop_skips_offline_nodes_and_entities_evaluated_since_when_asked(tmp_path: Path) -> None:
    core = idle_core(tmp_path, "for: 1h")
    core.step(held_idle(), at(0))
    core.step(held_idle(node="n2"), at(0))
    core.state.set_online(core.state.nodes["n2"], False, at(1))
    rule = core.rules.by_name["idle"]
    ents = list(core.state.by_kind["gpu"].values())
    out = StepResult()
    core.evaluator.evaluate(rule, ents, at(3600), out, since=at(0))
    assert out.incidents == []  # both incidents were evaluated at 0: nothing to catch up
    core.evaluator.evaluate(rule, ents, at(3600), out, online_only=True)
    assert [(t.entity_id, t.to_status) for t in out.transitions] == [("n1/gpu0", "firing")]  # n2 is offline
    core.evaluator.evaluate(rule, ents, at(3600), out)
    assert [(t.entity_id, t.to_status) for t in out.transitions][1:] == [("n2/gpu0", "firing")]


def test_a_sweep_closes_the_incident_of_a_snoozed_entity_and_opens_none(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    core.step(held_idle(), at(0))
    core.book.set_snooze(Snooze(rule="idle", entity_id="n1/gpu0", until=at(600)))
    out = StepResult()
    core.evaluator.sweep(core.rules.by_name["idle"], at(10), out)
    assert [(t.to_status, t.reason) for t in out.transitions] == [("resolved", "snoozed")]
    again = StepResult()
    core.evaluator.sweep(core.rules.by_name["idle"], at(20), again)
    assert again.transitions == [] and core.open_incidents() == []


def test_a_snoozed_process_exempts_that_process_not_a_later_one_with_its_pid(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: old-process
    entity: process
    when: process.user == 'alice'
    actions: [{type: log, message: "{{ entity.id }}"}]
"""))
    first = proc(42, created=at(-3600))
    core.step(snapshot(at(0), gpus=[gpu(0)], processes=[first]), at(0))
    core.step(Snooze(rule="old-process", entity_id="n1/pid42", until=at(7200)), at(10))
    assert core.open_incidents() == []  # the snooze closed it
    reused = proc(42, created=at(100))  # the first process ended; a new one got pid 42
    out = core.step(snapshot(at(120), gpus=[gpu(0)], processes=[reused]), at(120))
    assert [t.to_status for t in out.transitions][-1] == "firing"
    assert [a.entity_id for a in out.actions] == ["n1/pid42"]


RESOLVE_WORDS = """\
rules:
  - name: idle
    entity: gpu
    when: gpu.idle and gpu.processes
    actions: [{type: log, message: fired}]
    on_resolve:
      - type: log
        message: "{{ incident.resolve_reason }} / {{ incident.resolved_because }}"
"""


def _resolve_message(out: StepResult) -> str:
    [req] = [a for a in out.actions if a.phase == "resolve"]
    return str(req.params["message"])


def test_a_keep_resolves_as_kept_by_whom_until_when_not_as_cleared(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, RESOLVE_WORDS))
    core.step(held_idle(), at(0))
    out = core.step(Snooze(rule="idle", entity_id="n1/gpu0", until=at(4 * 3600), by="alice", bounded=True),
                    at(10))
    assert [(t.to_status, t.reason) for t in out.transitions] == [("resolved", "kept")]
    until = at(4 * 3600).strftime("%Y-%m-%d %H:%M UTC")
    assert _resolve_message(out) == f"kept / kept by alice until {until}"
    [inc] = out.incidents
    assert (inc.resolve_reason, inc.resolved_by, inc.kept_until) == ("kept", "alice", at(4 * 3600))


def test_an_operators_snooze_says_snoozed_and_a_cleared_condition_says_cleared(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, RESOLVE_WORDS))
    core.step(held_idle(), at(0))
    out = core.step(Snooze(rule="idle", entity_id="n1/gpu0", until=at(600), by="ops"), at(10))
    assert _resolve_message(out).startswith("snoozed / snoozed by ops until ")
    core = Core(rules_from(tmp_path, RESOLVE_WORDS))
    core.step(held_idle(), at(0))
    out = core.step(held_idle(800, util=90), at(800))
    assert _resolve_message(out) == "condition / cleared: the rule's condition no longer holds"


def test_the_demo_says_kept_not_busy_again_when_the_owner_keeps_the_gpu(tmp_path: Path) -> None:
    demo = (Path(__file__).parents[3] / "rules/library/demo/demo.yaml").read_text()
    core = Core(rules_from(tmp_path, demo))
    core.step(held_idle(0), at(0))
    fired = core.step(held_idle(40), at(40))
    assert any(a.rule == "demo-idle-gpu-30s" and a.phase == "fire" for a in fired.actions)
    out = core.step(Snooze(rule="demo-idle-gpu-30s", entity_id="n1/gpu0", until=at(3600), by="alice",
                           bounded=True), at(50))
    [msg] = [a.params["message"] for a in out.actions if a.phase == "resolve"]
    assert msg.startswith("GPU 0 on n1: kept by alice until ") and "busy again" not in msg
    core.step(Snooze(rule="demo-idle-gpu-30s", entity_id="n1/gpu0", until=at(0)), at(60))  # lifted
    core.step(held_idle(100), at(100))
    out = core.step(held_idle(110, util=90), at(110))
    assert [a.params["message"] for a in out.actions if a.phase == "resolve"] == ["GPU 0 on n1 is busy again"]
