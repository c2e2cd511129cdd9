"""Fleet shares in the action's unit: cordon counts nodes, kill the entities of its kind; no hold decided on a
fleet only partly observed since a restore; the audit reason says the share."""

from __future__ import annotations

from pathlib import Path

from gpuevents.config import Config
from gpuevents.events import SnapshotEvent
from rules.core.core import Core, Tick
from tests.rules.helpers import at, gpu, proc, rules_from, snapshot

HOT_CORDON = """\
rules:
  - name: hot
    entity: gpu
    when: gpu.temp_c > 85
    {limits}
    actions: [{{type: cordon}}]
    on_resolve: [{{type: uncordon}}]
"""


def node(t: float, name: str, hot: bool) -> SnapshotEvent:
    return snapshot(at(t), node=name, gpus=[gpu(i, 90, temp_c=90 if hot and i == 0 else 50) for i in range(8)])


def test_engine_cordon_share_is_counted_in_nodes_not_gpus(tmp_path: Path) -> None:
    cfg = Config.model_validate({"engine": {"limits": {"cordon": {"max_fleet_pct": 10}}}})
    core = Core(rules_from(tmp_path, HOT_CORDON.format(limits="")), cfg)
    for i in range(10):
        core.step(node(0, f"n{i}", hot=False), at(0))
    decisions = []
    for i in range(8):
        decisions += core.step(node(10, f"n{i}", hot=True), at(10)).actions
    assert [a.decision for a in decisions] == ["run"] + ["held"] * 7  # 1 of 10 nodes is 10%; 2 of 10 is over
    assert "2 of 10 nodes (20.0%)" in (decisions[1].reason or "")
    assert "engine.limits.cordon.max_fleet_pct 10%" in (decisions[1].reason or "")


def test_two_hot_gpus_of_one_node_are_one_node(tmp_path: Path) -> None:
    cfg = Config.model_validate({"engine": {"limits": {"cordon": {"max_fleet_pct": 10}}}})
    core = Core(rules_from(tmp_path, HOT_CORDON.format(limits="")), cfg)
    for i in range(10):
        core.step(node(0, f"n{i}", hot=False), at(0))
    out = core.step(snapshot(at(10), node="n0", gpus=[gpu(i, 90, temp_c=90) for i in range(8)]), at(10))
    assert [a.decision for a in out.actions] == ["run"] * 8  # the same node: 1 of 10


def test_kill_shares_count_the_entities_of_the_rules_kind(tmp_path: Path) -> None:
    cfg = Config.model_validate({"engine": {"limits": {"kill": {"max_fleet_pct": 40}}}})
    core = Core(rules_from(tmp_path, """\
rules:
  - name: by-process
    entity: process
    when: process.user == 'bob'
    actions: [{type: kill}]
  - name: by-gpu
    entity: gpu
    when: gpu.temp_c > 85
    actions: [{type: kill}]
"""), cfg)
    gpus = [gpu(i, 90, temp_c=90 if i == 0 else 50) for i in range(4)]  # 1 of 4 GPUs: 25%
    procs = [proc(1, user="bob", gpus=[1]), proc(2, user="bob", gpus=[2]), proc(3, gpus=[3])]  # 2 of 3: 67%
    out = core.step(snapshot(at(0), gpus=gpus, processes=procs), at(0))
    by_rule = {(a.rule, a.decision) for a in out.actions}
    assert ("by-gpu", "run") in by_rule  # GPUs are not crowded out by the firing processes
    # both held: the share counts every process the snapshot matched, not the first one alone (DESIGN §3.4)
    assert sorted(a.decision for a in out.actions if a.rule == "by-process") == ["held", "held"]


def test_a_rule_share_reason_says_how_many(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, HOT_CORDON.format(limits="limits: {max_fleet_pct: 10}")))
    out = core.step(snapshot(at(0), gpus=[gpu(0, temp_c=90), gpu(1, temp_c=90), gpu(2), gpu(3)]), at(0))
    assert [a.decision for a in out.actions] == ["held", "held"]
    assert "1 of 1 nodes (100.0%) match hot" in (out.actions[0].reason or "")  # cordon counts nodes


def test_after_a_restore_no_hold_is_decided_before_the_fleet_is_observed(tmp_path: Path) -> None:
    cfg = Config.model_validate({"engine": {"limits": {"cordon": {"max_fleet_pct": 30}}}})
    core = Core(rules_from(tmp_path, HOT_CORDON.format(limits="")), cfg)  # snapshots every 15 s
    core.restore([], now=at(0))
    out = core.step(node(1, "n0", hot=True), at(1))  # seen alone, n0 would be 1 of 1 node: held for good
    assert out.actions == [] and [t.to_status for t in out.transitions] == ["pending"]
    for t in range(0, 60, 15):
        for i in range(1, 4):
            core.step(node(t, f"n{i}", hot=False), at(t))
        core.step(node(t, "n0", hot=True), at(t))
        out = core.step(Tick(), at(t))
        if t == 30:
            assert core.next_wakeup(at(30)) == at(45)  # three snapshot intervals after the restore
        if t < 45:
            assert out.actions == []
        if t == 45:
            assert [(a.type, a.decision) for a in out.actions] == [("cordon", "run")]  # 1 of 4 nodes
    assert [i.status for i in core.open_incidents()] == ["firing"]


def test_without_a_restore_nothing_waits(tmp_path: Path) -> None:
    cfg = Config.model_validate({"engine": {"limits": {"cordon": {"max_fleet_pct": 30}}}})
    core = Core(rules_from(tmp_path, HOT_CORDON.format(limits="")), cfg)
    out = core.step(node(0, "n0", hot=True), at(0))
    assert [a.decision for a in out.actions] == ["held"]  # a rule test or a backtest sees its whole fleet
