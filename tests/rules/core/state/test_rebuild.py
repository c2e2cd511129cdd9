"""Fleet state keeps the views of unchanged entities and evaluates only what changed, with the same outcomes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rules.core.core import Core
from rules.core.state import FleetState
from rules.lang.views import EvalClock
from tests.rules.helpers import T0, at, gpu, proc, rules_from, snapshot

RULES = """\
rules:
  - name: held-idle
    entity: gpu
    when: gpu.idle and gpu.processes
    for: 1m
    actions: [{type: log, message: "held {{ gpu.id }}"}]
  - name: hot
    entity: gpu
    when: gpu.temp_c is not none and gpu.temp_c > 80
    actions: [{type: log, message: "hot {{ gpu.id }}"}]
  - name: ghost
    entity: process
    when: >-
      process.ppid == 1 and gpus and (gpus | selectattr('idle') | list | length) == (gpus | length)
    actions: [{type: log, message: "ghost {{ process.pid }}"}]
  - name: half-idle
    entity: node
    when: (gpus | selectattr('idle') | list | length) * 2 >= (gpus | length) and node.labels.pool == 'a'
    actions: [{type: log, message: "half {{ node.name }}"}]
  - name: tier
    entity: gpu
    when: node.labels.tier == 'gold'
    actions: [{type: log, message: "never"}]
  - name: old
    entity: process
    when: process.age_s > 600
    actions: [{type: log, message: "old {{ process.pid }}"}]
  - name: power
    entity: gpu
    when: gpu.power_w is not none and gpu.power_w > 250 and gpu.processes | selectattr('gpu_util_pct') | list
    for: 30s
    actions: [{type: log, message: "power {{ gpu.power_w }}"}]
"""


def fleet() -> FleetState:
    return FleetState(EvalClock(T0))


def two_gpus(t: float, temp: float = 50, idle_for: float | None = None, age: float | None = None,
             labels: dict[str, str] | None = None) -> Any:
    return snapshot(at(t), gpus=[gpu(0, temp_c=temp, idle_since=T0, idle_for_s=idle_for, pids=[42]),
                                 gpu(1, 90, pids=[43])],
                    processes=[proc(42, ppid=1, age_s=age), proc(43, gpus=[1])], labels=labels or {"pool": "a"})


def test_a_repeated_snapshot_changes_nothing_and_keeps_every_view() -> None:
    state = fleet()
    first = state.apply(two_gpus(0), at(0))
    assert first is not None and [e.key for e in first.changed] == [
        "n1", "n1/gpu0", "n1/gpu1", "n1/pid42@1767571200", "n1/pid43@1767571200"]
    views = {k: e.view for k, e in state.nodes["n1"].entities.items()}
    again = state.apply(two_gpus(15, idle_for=15.0, age=15.0), at(15))
    assert again is not None and again.changed == [] and again.gone == []
    assert {k: e.view for k, e in state.nodes["n1"].entities.items()} == views
    assert state.nodes["n1"].node_entity is not None and state.nodes["n1"].node_entity.view.last_seen == at(15)


def test_one_changed_gpu_changes_itself_its_processes_and_the_node_only() -> None:
    state = fleet()
    state.apply(two_gpus(0), at(0))
    change = state.apply(two_gpus(15, temp=95), at(15))
    assert change is not None and [e.key for e in change.changed] == ["n1", "n1/gpu0", "n1/pid42@1767571200"]
    assert {k: sorted(d) for k, d in change.deltas.items()} == {  # what changed, for the rules that read it
        "n1": ["temp_c"], "n1/gpu0": ["temp_c"], "n1/pid42@1767571200": ["temp_c"]}
    assert state.nodes["n1"].entities["n1/gpu0"].view.temp_c == 95
    # The process's context sees the new GPU view.
    assert state.nodes["n1"].entities["n1/pid42@1767571200"].ctx["gpus"][0].temp_c == 95


def test_a_gone_process_changes_the_gpu_it_was_on() -> None:
    state = fleet()
    state.apply(two_gpus(0), at(0))
    snap = snapshot(at(15), gpus=[gpu(0, temp_c=50, idle_since=T0, pids=[42]), gpu(1, 90, pids=[43])],
                    processes=[proc(42, ppid=1)], labels={"pool": "a"})
    change = state.apply(snap, at(15))
    assert change is not None
    assert [e.key for e in change.gone] == ["n1/pid43@1767571200"]
    assert [e.key for e in change.changed] == ["n1", "n1/gpu1"]
    assert state.nodes["n1"].entities["n1/gpu1"].view.processes == []


def test_a_node_label_change_re_evaluates_everything() -> None:
    state = fleet()
    state.apply(two_gpus(0), at(0))
    change = state.apply(two_gpus(15, labels={"pool": "b"}), at(15))
    assert change is not None and len(change.changed) == 5


def test_an_erroring_condition_is_evaluated_again_on_every_event(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, RULES))
    core.step(two_gpus(0), at(0))
    before = sum(n for (rule, _), n in core.error_counts.items() if rule == "tier")
    core.step(two_gpus(15), at(15))
    assert sum(n for (rule, _), n in core.error_counts.items() if rule == "tier") == 2 * before == 4
