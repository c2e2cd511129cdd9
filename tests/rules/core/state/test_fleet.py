"""The fleet state: processes keyed by pid and create time, process and GPU events, entity ids per cluster."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from gpuevents.events import GpuEvent, GpuXid, ProcessEvent, make_event
from rules.core.core import Core
from rules.core.state import FleetState
from rules.lang.views import EvalClock
from tests.rules.helpers import T0, at, gpu, held_idle, idle_core, proc, rules_from, snapshot


def test_a_reused_pid_is_a_new_process(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: p
    entity: process
    when: process.pid == 42
    actions: [{type: log, message: "{{ process.create_time }}"}]
"""))
    core.step(snapshot(at(0), gpus=[gpu(0)], processes=[proc(42)]), at(0))
    out = core.step(snapshot(at(60), gpus=[gpu(0)], processes=[proc(42, created=at(50))]), at(60))
    assert [(t.entity_id, t.to_status, t.reason) for t in out.transitions] == [
        ("n1/pid42", "resolved", "gone"), ("n1/pid42", "pending", ""), ("n1/pid42", "firing", "")]
    # a create time that wobbles under a second is the same process
    out = core.step(snapshot(at(90), gpus=[gpu(0)], processes=[proc(42, created=at(50.4))]), at(90))
    assert out.transitions == []


def test_process_events_add_and_remove_processes(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    core.step(snapshot(at(0), gpus=[gpu(0)]), at(0))
    out = core.step(make_event("process.started", "n1", proc(7), time=at(5)), at(5))
    assert [t.to_status for t in out.transitions] == ["pending", "firing"]
    assert core.gpus()[0].owners == ["alice"]
    ended = make_event("process.ended", "n1", proc(7), time=at(9))
    assert isinstance(ended, ProcessEvent)
    out = core.step(ended, at(9))
    assert [t.to_status for t in out.transitions] == ["resolved"]


def test_a_gpu_threshold_event_updates_that_gpu(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    core.step(held_idle(util=90), at(0))
    ev = make_event("gpu.idle", "n1", gpu(0, 0, pids=[42]), time=at(30))
    assert isinstance(ev, GpuEvent)
    out = core.step(ev, at(30))
    assert [t.to_status for t in out.transitions] == ["pending", "firing"]
    assert core.gpus()[0].idle_since == at(30) and core.nodes()[0].gpus_idle == 1


def test_clusters_other_than_the_engines_prefix_entity_ids(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    (req,) = core.step(held_idle(cluster="c2"), at(0)).actions
    assert req.entity_id == "c2:n1/gpu0" and req.cluster == "c2"


def test_a_gpus_last_xid_is_kept_across_snapshots_for_rules_to_read() -> None:
    state = FleetState(EvalClock(T0))
    state.apply(snapshot(T0, gpus=[gpu(0, 90)]), T0)
    xid = make_event("gpu.xid", "n1", GpuXid(node="n1", index=0, util_pct=90, xid=79),
                     time=T0 + timedelta(seconds=5))
    state.apply(xid, T0 + timedelta(seconds=5))
    state.apply(snapshot(T0 + timedelta(seconds=15), gpus=[gpu(0, 90)]), T0 + timedelta(seconds=15))
    (view,) = [e.view for e in state.by_kind["gpu"].values()]
    assert view.xid == 79 and view.xid_at == T0 + timedelta(seconds=5)


def test_rules_check_accepts_the_xid_fields(tmp_path: Path) -> None:
    from rules.intake.check import check_paths

    (tmp_path / "r.yaml").write_text("""\
rules:
  - name: xid
    entity: gpu
    when: gpu.xid == 79
    actions: [{type: log, message: "XID {{ gpu.xid }} at {{ gpu.xid_at }}"}]
""")
    rules, problems = check_paths([tmp_path / "r.yaml"])
    assert problems == [] and rules is not None
