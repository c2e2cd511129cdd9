"""The core's steps: an event evaluates what it changed, a tick's sweep done in slices, a reload."""

from __future__ import annotations

from pathlib import Path

from gpuevents.config import Config
from rules.core.core import Core, Sweep, Tick
from tests.rules.helpers import IDLE, T0, at, gpu, held_idle, idle_core, rules_from, snapshot


def test_an_event_fires_a_rule_without_for_at_once(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    out = core.step(held_idle(), at(0))
    assert [(t.from_status, t.to_status) for t in out.transitions] == [("inactive", "pending"), ("pending", "firing")]
    (req,) = out.actions
    inc = out.incidents[-1]
    assert req.key == f"{inc.id}:fire:0:0"
    assert (req.type, req.decision, req.entity_id, req.node, req.phase) == ("slack", "run", "n1/gpu0", "n1", "fire")
    assert req.params == {"to": "alice", "text": "GPU 0 held by train.py <b>"}
    assert req.facts["processes"][0]["pid"] == 42 and req.facts["processes"][0]["create_time"] == T0.isoformat()
    assert req.facts["incident"]["id"] == inc.id and req.facts["cost"]["text"].startswith("$")


def test_resolution_runs_on_resolve_and_the_next_true_is_a_new_incident(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    first = core.step(held_idle(), at(0)).incidents[-1]
    out = core.step(held_idle(60, util=90), at(60))
    assert [t.to_status for t in out.transitions] == ["resolved"]
    assert [(a.type, a.phase, a.params["message"]) for a in out.actions] == [("log", "resolve",
                                                                              "idle resolved on n1/gpu0")]
    again = core.step(held_idle(120), at(120)).incidents[-1]
    assert again.id != first.id and again.status == "firing"


def test_replacing_rules_keeps_incidents_of_unchanged_rules(tmp_path: Path) -> None:
    both = IDLE.format(extra="") + """\
  - name: hot
    entity: gpu
    when: gpu.util_pct >= 0
    actions: [{type: log, message: m}]
"""
    core = Core(rules_from(tmp_path, both))
    core.step(held_idle(), at(0))
    assert {i.rule for i in core.open_incidents()} == {"idle", "hot"}
    reload = core.replace_rules(rules_from(tmp_path, both.replace("util_pct >= 0", "util_pct >= -1")))
    dropped = reload.incidents  # the result of a reload: the closed incidents (and their transitions, actions)
    assert [i.rule for i in dropped] == ["hot", "hot"] and {i.rule for i in core.open_incidents()} == {"idle"}
    out = core.step(Tick(), at(10))  # changed rules are evaluated in full at the next tick
    assert {(t.rule, t.to_status) for t in out.transitions} == {("hot", "pending"), ("hot", "firing")}


def test_a_sweep_in_slices_gives_what_one_tick_gives(tmp_path: Path) -> None:
    """The engine sweeps time-dependent rules a slice of entities at a time (`Tick(sweep=False)` names them,
    `Sweep` steps evaluate them); done at the tick's time, that is the same as one full tick."""
    text = """\
rules:
  - name: timed
    entity: gpu
    when: gpu.idle_for_s > 30
    for: 60s
    actions: [{type: log, message: m}]
  - name: untimed
    entity: gpu
    when: gpu.util_pct > 50
    actions: [{type: log, message: m}]
"""
    cfg = Config.model_validate({"agent": {"snapshot_interval": "1h"}})  # online for three hours
    whole, sliced = Core(rules_from(tmp_path, text), cfg), Core(rules_from(tmp_path, text), cfg)
    for core in (whole, sliced):
        for n in range(5):
            core.step(snapshot(at(0), node=f"n{n}", gpus=[gpu(0, 0), gpu(1, 90), gpu(2, 0)]), at(0))

    def seen(t: float) -> list[tuple[str, str, str]]:
        one = whole.step(Tick(), at(t))
        part = sliced.step(Tick(sweep=False), at(t))
        if t == 40:  # the sweep is left to the Sweep steps
            assert part.sweeps == ["timed"] and part.transitions == []
        for name in part.sweeps:
            keys = list(sliced.state.by_kind["gpu"])
            for i in range(0, len(keys), 4):
                part.extend(sliced.step(Sweep(rule=name, keys=tuple(keys[i:i + 4])), at(t)))
        got: list[tuple[str, str, str]] = sorted((x.rule, x.entity_id, x.to_status) for x in part.transitions)
        assert got == sorted((x.rule, x.entity_id, x.to_status) for x in one.transitions)
        return got

    assert seen(10) == []
    assert seen(40) == sorted(("timed", f"n{n}/gpu{g}", "pending") for n in range(5) for g in (0, 2))
    assert seen(130) == sorted(("timed", f"n{n}/gpu{g}", "firing") for n in range(5) for g in (0, 2))
    assert [i.status for i in sliced.open_incidents()] == [i.status for i in whole.open_incidents()]


def test_a_sweep_slice_of_a_rule_changed_since_is_left_to_its_next_sweep(tmp_path: Path) -> None:
    cfg = Config.model_validate({"agent": {"snapshot_interval": "1h"}})
    core = Core(rules_from(tmp_path, """\
rules:
  - name: timed
    entity: gpu
    when: gpu.idle_for_s > 30
    actions: [{type: log, message: m}]
"""), cfg)
    core.step(snapshot(at(0), gpus=[gpu(0, 0)]), at(0))
    keys = tuple(core.state.by_kind["gpu"])
    rule = core.rules.by_name["timed"]
    assert core.step(Sweep(rule="timed", keys=keys, rule_hash="a-rule-since-replaced"), at(40)).transitions == []
    fired = core.step(Sweep(rule="timed", keys=keys, rule_hash=rule.hash), at(40)).transitions
    assert [(t.entity_id, t.to_status) for t in fired][-1] == ("n1/gpu0", "firing")
