"""The incremental core is exact: what it skips (repeats, unchanged lists, rebuilt jobs) changes no outcome.

Each test is one of the divergences a differential test found between the core as it runs and the core forced to
rebuild and re-evaluate everything (issue 22); the property test in state/test_rebuild.py covers the rest.
"""

from __future__ import annotations

from pathlib import Path

from gpuevents.events import AgentInfo, JobInfo, SnapshotEvent, make_event
from rules.core.core import Core, ForgetNode, Tick
from rules.core.inputs import StepResult
from tests.rules.helpers import at, config, gpu, rules_from, snapshot, with_data


def fired(out: StepResult) -> list[tuple[str, str, str]]:
    return [(t.rule, t.entity_id, t.to_status) for t in out.transitions]


def test_agent_reported_owners_of_a_gpu_without_processes_are_read_again(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: alice-busy
    entity: gpu
    when: gpu.owner == 'alice' and not gpu.idle
    actions: [{type: log, message: "{{ gpu.owner }}"}]
"""))
    out = core.step(snapshot(at(0), gpus=[gpu(0, 90, owners=["alice"])]), at(0))
    assert fired(out)[-1] == ("alice-busy", "n1/gpu0", "firing")
    out = core.step(snapshot(at(60), gpus=[gpu(0, 90, owners=["carol"])]), at(60))
    assert core.gpus()[0].owner == "carol" and core.gpus()[0].owners == ["carol"]
    assert fired(out) == [("alice-busy", "n1/gpu0", "resolved")]


JOB_RULES = """\
rules:
  - name: spread-idle
    entity: job
    when: job.nodes | length > 1 and job.idle
    actions: [{type: log, message: "{{ job.id }}"}]
  - name: job-idle-for
    entity: job
    when: job.idle
    for: 1m
    actions: [{type: log, message: "{{ job.id }}"}]
  - name: job-idle-long
    entity: job
    when: job.idle and job.idle_for_s > 120
    actions: [{type: log, message: "{{ job.id }}"}]
"""


def job_snapshot(t: float, node: str, idle_for: float | None = None) -> SnapshotEvent:
    ev = snapshot(at(t), node, gpus=[gpu(0, idle_since=at(0))])
    return with_data(ev, jobs=[JobInfo(id="7", user="erin", gpus=[0])])


def test_a_forgotten_node_re_evaluates_the_jobs_it_held(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, JOB_RULES))
    core.step(job_snapshot(0, "n1"), at(0))
    out = core.step(job_snapshot(0, "n2"), at(0))
    assert ("spread-idle", "job/slurm/7", "firing") in fired(out)
    out = core.step(ForgetNode(node="n1"), at(10))
    assert core.state.by_kind["job"]["job/slurm/7"].view.nodes == ["n2"]
    assert ("spread-idle", "job/slurm/7", "resolved") in fired(out)
    assert {i.rule for i in core.open_incidents()} == {"job-idle-for"}


def test_a_node_offline_past_its_grace_re_evaluates_the_jobs_it_held(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, JOB_RULES), config(offline_grace="2m", tick="15s"))
    core.step(job_snapshot(0, "n1"), at(0))
    core.step(job_snapshot(0, "n2"), at(0))
    resolved_at = None
    for t in range(15, 400, 15):  # n1 says nothing more; n2 keeps reporting
        core.step(job_snapshot(t, "n2"), at(t))
        out = core.step(Tick(), at(t))
        if ("spread-idle", "job/slurm/7", "resolved") in fired(out):
            resolved_at = t
            break
    assert "n1" not in core.state.nodes and resolved_at is not None
    assert resolved_at <= 45 + 120 + 15  # offline after 3 intervals (45 s), gone after the grace


def test_a_repeated_snapshot_derives_the_idle_start_as_a_changed_one_would(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: idle-long
    entity: gpu
    when: gpu.idle and gpu.idle_for_s > 300
    actions: [{type: log, message: "{{ gpu.id }}"}]
"""))
    first = snapshot(at(0), gpus=[gpu(0, idle_for_s=100.0)])
    core.step(first, at(0))
    again = first.model_copy(update={"time": at(1800)})  # the same data, byte for byte, 30 minutes later
    out = core.step(again, at(1800))
    assert core.gpus()[0].idle_since == at(1700)
    assert fired(out) == []
    equal = snapshot(at(3600), gpus=[gpu(0, idle_for_s=100.0)])  # an equal copy (not the decoder's object)
    assert core.step(equal, at(3600)) == StepResult() and core.gpus()[0].idle_since == at(3500)


def test_a_repeated_snapshot_moves_its_jobs_clock_rules_and_deadlines(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, JOB_RULES))
    core.step(job_snapshot(0, "n1"), at(0))
    out = core.step(job_snapshot(61, "n1"), at(61))  # the same readings: a repeat
    assert fired(out) == [("job-idle-for", "job/slurm/7", "firing")]
    out = core.step(job_snapshot(130, "n1"), at(130))
    assert fired(out) == [("job-idle-long", "job/slurm/7", "pending"), ("job-idle-long", "job/slurm/7", "firing")]


def test_a_deadline_that_came_due_while_its_node_was_offline_moves_at_its_next_event(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: idle-for
    entity: gpu
    when: gpu.idle
    for: 1m
    actions: [{type: log, message: "{{ gpu.id }}"}]
"""), config(offline_grace="1h"))
    snap = snapshot(at(0), gpus=[gpu(0, idle_since=at(0))])
    core.step(snap, at(0))
    assert fired(core.step(Tick(), at(100))) == []  # offline since 45 s: not evaluated at its deadline
    assert core.next_wakeup(at(100)) > at(100)  # and no tick is asked for it meanwhile
    # its agent starts again: the node is back, and what came due is moved at once (as at a repeat)
    out = core.step(make_event("agent.started", "n1", AgentInfo(node="n1", version="1"), time=at(110)), at(110))
    assert fired(out) == [("idle-for", "n1/gpu0", "firing")]


def test_an_event_after_a_jobs_exemption_ended_evaluates_it_as_a_full_evaluation_would(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: job-idle
    entity: job
    when: job.idle
    actions: [{type: log, message: "{{ job.id }}"}]
"""))
    part = JobInfo(id="7", scheduler="kubernetes", gpus=[0],
                   annotations={"gpuevents.io/keep-until": at(60).isoformat().replace("+00:00", "Z")})
    ev = snapshot(at(0), gpus=[gpu(0, idle_since=at(0))])
    ev = with_data(ev, jobs=[part])
    assert fired(core.step(ev, at(0))) == []  # kept until 60
    out = core.step(ev.model_copy(update={"time": at(90)}), at(90))  # a repeat after the keep ended, before a tick
    assert fired(out) == [("job-idle", "job/kubernetes/7", "pending"), ("job-idle", "job/kubernetes/7", "firing")]
