"""Fleet state keeps the views of unchanged entities and evaluates only what changed, with the same outcomes."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuevents.events import AgentInfo, GpuInfo, ProcessInfo, make_event
from rules.core.core import Core, CoreInput, Tick
from rules.core.inputs import StepResult
from rules.core.state import FleetState
from rules.lang.views import EvalClock
from tests.quick import examples
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


# ---------------------------------------------------------------- property: diffed == rebuilt every time


def _gpu(index: int, state: int, temp: float, noise: int = 0) -> GpuInfo:
    """A GPU busy (0) or idle, held (1) or not (2); `noise` moves its readings as a real agent's do."""
    util = 0.0 if state else 90.0 + noise
    return gpu(index, util, temp_c=temp + noise, power_w=80.0 + 110 * noise, idle_since=T0 if state else None,
               pids=[40 + index] if state != 2 else [])


def _procs(n: int, ppid: int, noise: int = 0) -> list[ProcessInfo]:
    return [proc(40 + i, gpus=[i], ppid=ppid, created=T0 - timedelta(minutes=5), gpu_util_pct=float(noise))
            for i in range(n)]


@st.composite
def _inputs(draw: st.DrawFn) -> list[tuple[float, CoreInput]]:
    out: list[tuple[float, CoreInput]] = []
    t = 0.0
    temps = st.sampled_from([50.0, 50.0, 95.0])
    for _ in range(draw(st.integers(3, 14))):
        t += draw(st.sampled_from([5.0, 15.0, 15.0, 70.0, 400.0]))
        node = draw(st.sampled_from(["n1", "n2"]))
        kind = draw(st.sampled_from(["snap", "snap", "snap", "gpu", "proc", "stop", "start", "tick"]))
        if kind == "snap":
            n = draw(st.integers(0, 3))
            noise = st.integers(0, 2)
            gpus = [_gpu(i, draw(st.integers(0, 2)), draw(temps), draw(noise)) for i in range(n)]
            procs = _procs(draw(st.integers(0, n)), draw(st.sampled_from([1, 7])), draw(noise))
            labels = {"pool": draw(st.sampled_from(["a", "a", "b"]))}
            out.append((t, snapshot(at(t), node, gpus=gpus, processes=procs, labels=labels)))
        elif kind == "gpu":
            g = _gpu(draw(st.integers(0, 2)), draw(st.integers(0, 2)), draw(temps)).model_copy(update={"node": node})
            out.append((t, make_event("gpu.hot", node, g, time=at(t))))
        elif kind == "proc":
            p = _procs(3, 1)[draw(st.integers(0, 2))].model_copy(update={"node": node})
            ev = draw(st.sampled_from(["process.started", "process.ended"]))
            out.append((t, make_event(ev, node, p, time=at(t))))
        elif kind in ("stop", "start"):
            ev = "agent.stopping" if kind == "stop" else "agent.started"
            out.append((t,
                        make_event(ev, node, AgentInfo(node=node, version="1", snapshot_interval_s=15.0), time=at(t))))
        else:
            out.append((t, Tick()))
    return out


def _summary(result: StepResult) -> list[tuple[str, ...]]:
    return sorted([(tr.rule, tr.entity_id, tr.from_status, tr.to_status, tr.reason) for tr in result.transitions]
                  + [(a.rule, a.entity_id, a.key, str(a.params)) for a in result.actions])


_RULES_CACHE: dict[str, Any] = {}


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                     HealthCheck.function_scoped_fixture])
@given(inputs=_inputs())
def test_evaluating_only_changed_entities_gives_what_rebuilding_everything_gives(
    tmp_path: Path, inputs: list[tuple[float, CoreInput]],
) -> None:
    if "rules" not in _RULES_CACHE:
        _RULES_CACHE["rules"] = rules_from(tmp_path, RULES)
    diffed = Core(_RULES_CACHE["rules"])
    rebuilt = Core(_RULES_CACHE["rules"])
    for t, item in inputs:
        for ns in rebuilt.state.nodes.values():
            ns.full_next = True  # what the state did before it kept unchanged views: rebuild and evaluate all
        ours = diffed.step(item, at(t))
        theirs = rebuilt.step(item, at(t))
        assert _summary(ours) == _summary(theirs), item
        assert sorted(diffed.error_counts) == sorted(rebuilt.error_counts)
    assert {(i.rule, i.entity_key, i.status) for i in diffed.open_incidents()} == {
        (i.rule, i.entity_key, i.status) for i in rebuilt.open_incidents()}
