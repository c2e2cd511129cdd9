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
