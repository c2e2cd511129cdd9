"""The incremental core is exact, continued: divergences the widened differential test found (issue 22).

Each test is one case where the core as it runs gave another outcome than a core forced to rebuild and
re-evaluate everything (tests/rules/core/test_differential.py); each fails without its fix.
"""

from __future__ import annotations

from pathlib import Path

from gpuevents.events import (
    SCHEDULER_SOURCE,
    AgentInfo,
    Event,
    JobEnded,
    JobEndedEvent,
    JobInfo,
    SnapshotEvent,
    make_event,
)
from rules.core.core import Core, Snooze, Tick
from rules.core.inputs import StepResult
from rules.lang.exemptions import EXCLUDE, KEEP_UNTIL
from tests.rules.helpers import at, config, gpu, proc, rules_from, snapshot, with_data

HELD = """\
rules:
  - name: held-idle
    entity: gpu
    when: gpu.idle and gpu.processes
    for: 1m
    actions: [{type: log, message: "held {{ gpu.id }}"}]
"""


def moved(out: StepResult) -> list[tuple[str, str, str, str]]:
    return [(t.rule, t.entity_id, t.to_status, t.reason) for t in out.transitions]


def agent(kind: str, t: float, node: str = "n1") -> Event:
    return make_event(kind, node, AgentInfo(node=node, version="1", snapshot_interval_s=15.0), time=at(t))


def test_an_agent_that_starts_again_has_its_node_evaluated_as_it_is_now(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, HELD), config(tick="30s", offline_grace="10m"))
    core.step(snapshot(at(0), gpus=[gpu(0)], processes=[proc(42)]), at(0))
    assert [i.status for i in core.open_incidents()] == ["pending"]
    core.step(agent("agent.stopping", 10), at(10))  # offline at once: what comes is not evaluated
    busy = gpu(0, 90, pids=[42])
    core.step(make_event("gpu.active", "n1", busy, time=at(20)), at(20))
    assert core.open_incidents()[0].status == "pending"
    out = core.step(agent("agent.started", 30), at(30))
    # back: the GPU is busy now, as a full evaluation of the node sees it
    assert moved(out) == [("held-idle", "n1/gpu0", "inactive", "condition")]
    assert core.open_incidents() == []


def test_an_agent_event_moves_the_node_s_last_seen(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, HELD), config(tick="30s"))
    core.step(snapshot(at(0), gpus=[gpu(0, 90)]), at(0))
    core.step(agent("agent.started", 10), at(10))
    assert core.nodes()[0].last_seen == at(10)  # as a rebuild of the node's views now shows it


def test_a_deadline_that_came_due_while_a_node_was_silent_moves_when_its_agent_starts(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, HELD), config(tick="30s", offline_grace="10m"))
    core.step(snapshot(at(0), gpus=[gpu(0)], processes=[proc(42)]), at(0))
    core.step(Tick(), at(50))  # three snapshots missed: offline
    out = core.step(Tick(), at(60))  # the `for` is due, but nothing is evaluated on an offline node
    assert moved(out) == [] and core.open_incidents()[0].status == "pending"
    out = core.step(agent("agent.started", 70), at(70))
    assert moved(out) == [("held-idle", "n1/gpu0", "firing", "")]


KEPT = """\
rules:
  - name: in-job
    entity: process
    when: process.job is not none
    actions: [{type: log, message: "{{ process.pid }}"}]
"""


def kube_job(t: float, node: str, annotations: dict[str, str]) -> SnapshotEvent:
    ev = snapshot(at(t), node, gpus=[gpu(0, 90)])
    job = JobInfo(id="ml/Deployment/chat", scheduler="kubernetes", namespace="ml", gpus=[0], annotations=annotations)
    return with_data(ev, jobs=[job])


def test_a_job_kept_by_its_annotation_exempts_its_processes_on_other_nodes_at_once(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, KEPT), config(tick="30s"))
    # n1 runs a process of the job; n2 is the node the job's annotations come from
    out = core.step(snapshot(at(0), "n1", gpus=[gpu(0, 90)], processes=[proc(42, job="ml/Deployment/chat")]), at(0))
    assert moved(out)[-1] == ("in-job", "n1/pid42", "firing", "")
    out = core.step(kube_job(10, "n2", {KEEP_UNTIL: at(600).isoformat()}), at(10))
    assert moved(out) == [("in-job", "n1/pid42", "resolved", "exempt")]
    out = core.step(kube_job(20, "n2", {}), at(20))  # the annotation is taken off: no longer kept
    assert moved(out) == [("in-job", "n1/pid42", "pending", ""), ("in-job", "n1/pid42", "firing", "")]


def test_a_job_ended_while_its_nodes_still_list_it_is_evaluated_anew(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: job-busy
    entity: job
    when: not job.idle and job.ended_at is none
    actions: [{type: log, message: "{{ job.id }}"}]
"""), config(tick="30s"))
    ev = snapshot(at(0), "n1", gpus=[gpu(0, 90)])
    core.step(with_data(ev, jobs=[JobInfo(id="7", gpus=[0])]), at(0))
    assert [i.status for i in core.open_incidents()] == ["firing"]
    ended = JobEndedEvent(source=f"node/{SCHEDULER_SOURCE}", time=at(10),
                          data=JobEnded(id="7", nodes=["n1"], ended_at=at(10)))
    out = core.step(ended, at(10))
    # its ending resolves its incidents; the job n1 still lists opens them again, as a full evaluation finds it
    assert moved(out) == [("job-busy", "job/slurm/7", "resolved", "condition"),
                          ("job-busy", "job/slurm/7", "pending", ""),
                          ("job-busy", "job/slurm/7", "firing", "")]


def test_a_snooze_that_ended_while_its_node_was_offline_is_seen_when_the_node_is_back(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: hot
    entity: gpu
    when: gpu.temp_c > 80
    actions: [{type: log, message: "hot {{ gpu.id }}"}]
"""), config(tick="30s", offline_grace="10m"))
    core.step(snapshot(at(0), gpus=[gpu(0, 90, temp_c=95)]), at(0))
    out = core.step(Snooze(rule="hot", entity_id="n1/gpu0", until=at(100)), at(5))
    assert moved(out) == [("hot", "n1/gpu0", "resolved", "snoozed")]
    core.step(Tick(), at(60))  # offline: three snapshots missed
    core.step(Tick(), at(100))  # the snooze ends; nothing is evaluated on an offline node
    out = core.step(agent("agent.started", 110), at(110))
    assert moved(out) == [("hot", "n1/gpu0", "pending", ""), ("hot", "n1/gpu0", "firing", "")]


def test_an_event_between_a_reload_and_its_sweep_evaluates_the_new_rule_on_its_node(tmp_path: Path) -> None:
    hot = """\
rules:
  - name: hot
    entity: gpu
    when: gpu.temp_c > {limit}
    actions: [{{type: log, message: "hot {{{{ gpu.id }}}}"}}]
"""
    core = Core(rules_from(tmp_path, hot.format(limit=80)), config(tick="30s"))
    snap = snapshot(at(0), gpus=[gpu(0, 90, temp_c=75)])
    core.step(snap, at(0))
    assert core.open_incidents() == []
    core.replace_rules(rules_from(tmp_path, hot.format(limit=70), name="new.yaml"), at(10))
    out = core.step(snap.model_copy(update={"time": at(15)}), at(15))  # a repeat, before the tick's sweep
    assert moved(out) == [("hot", "n1/gpu0", "pending", ""), ("hot", "n1/gpu0", "firing", "")]


def test_a_snooze_of_a_liveness_rule_that_ends_while_its_node_is_offline_lets_it_fire(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: agent-down
    entity: node
    when: not node.online
    actions: [{type: log, message: "down {{ node.name }}"}]
"""), config(tick="30s", offline_grace="10m"))
    core.step(snapshot(at(0), gpus=[gpu(0, 90)]), at(0))
    core.step(Snooze(rule="agent-down", entity_id="n1", until=at(100)), at(5))
    assert moved(core.step(Tick(), at(60))) == []  # offline, but snoozed
    out = core.step(Tick(), at(100))  # the snooze ends: a rule that reads liveness sees the node offline
    assert moved(out) == [("agent-down", "n1", "pending", ""), ("agent-down", "n1", "firing", "")]


def test_the_engine_wakes_when_a_job_s_keep_ends(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, KEPT), config(tick="1h"), offline_detection=False)
    core.step(kube_job(0, "n2", {KEEP_UNTIL: at(600).isoformat()}), at(0))
    core.step(Tick(), at(1))
    assert core.next_wakeup(at(1)) == at(600)  # not an hour later: the keep's end is when the job is evaluated


def job_part(t: float, node: str, util: float) -> SnapshotEvent:
    ev = snapshot(at(t), node, gpus=[gpu(0, util, idle_since=at(0))])
    return with_data(ev, jobs=[JobInfo(id="7", user="erin", gpus=[0])])


def test_a_job_an_offline_node_changed_is_evaluated_at_its_other_node_s_next_event(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: spread-idle
    entity: job
    when: job.nodes | length > 1 and job.idle
    actions: [{type: log, message: "{{ job.id }}"}]
"""), config(tick="30s", offline_grace="10m"))
    core.step(job_part(0, "n1", 0), at(0))
    out = core.step(job_part(5, "n2", 0), at(5))
    assert moved(out)[-1] == ("spread-idle", "job/slurm/7", "firing", "")
    core.step(agent("agent.stopping", 10), at(10))  # n1 (the job's head node) is offline, and still reports:
    core.step(make_event("gpu.active", "n1", gpu(0, 90), time=at(15)), at(15))  # its GPU is busy now
    out = core.step(job_part(20, "n2", 0), at(20))  # n2 repeats itself: the job is not idle, as a full evaluation sees
    assert moved(out) == [("spread-idle", "job/slurm/7", "resolved", "condition")]


def test_a_job_ended_while_listed_and_its_head_node_offline_is_evaluated_at_its_next_event(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: spread-idle
    entity: job
    when: job.nodes | length > 1 and job.idle and job.ended_at is none
    actions: [{type: log, message: "{{ job.id }}"}]
"""), config(tick="30s", offline_grace="10m"))
    core.step(job_part(0, "n1", 0), at(0))
    core.step(job_part(5, "n2", 0), at(5))
    core.step(agent("agent.stopping", 10), at(10))  # n1, the job's head node, is offline
    ended = JobEndedEvent(source=f"node/{SCHEDULER_SOURCE}", time=at(15),
                          data=JobEnded(id="7", nodes=["n1", "n2"], ended_at=at(15)))
    out = core.step(ended, at(15))
    assert moved(out) == [("spread-idle", "job/slurm/7", "resolved", "condition")]
    out = core.step(job_part(20, "n2", 0), at(20))  # n2 still lists it, unchanged: a full evaluation finds it
    assert moved(out) == [("spread-idle", "job/slurm/7", "pending", ""), ("spread-idle", "job/slurm/7", "firing", "")]


def test_a_new_rule_swept_while_a_node_is_offline_is_evaluated_when_the_node_is_back(tmp_path: Path) -> None:
    rule = """\
  - name: {name}
    entity: gpu
    when: gpu.temp_c > {limit}
    actions: [{{type: log, message: "{{{{ gpu.id }}}}"}}]
"""
    core = Core(rules_from(tmp_path, "rules:\n" + rule.format(name="hot", limit=80)), config(tick="30s"))
    core.step(snapshot(at(0), gpus=[gpu(0, 90, temp_c=75)]), at(0))
    core.step(Tick(), at(50))  # offline
    core.replace_rules(rules_from(tmp_path, "rules:\n" + rule.format(name="hot", limit=80)
                                  + rule.format(name="warm", limit=70), name="new.yaml"), at(60))
    assert moved(core.step(Tick(), at(60))) == []  # the new rule's sweep skips the offline node
    out = core.step(agent("agent.started", 70), at(70))  # back, its readings as they were
    assert moved(out) == [("warm", "n1/gpu0", "pending", ""), ("warm", "n1/gpu0", "firing", "")]


def test_a_job_whose_exemption_ends_while_its_head_node_is_offline_is_evaluated_at_its_next_event(
    tmp_path: Path,
) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: job-excluded
    entity: job
    when: job.exempt_until is not none
    actions: [{type: log, message: "{{ job.id }}"}]
"""), config(tick="30s", offline_grace="10m"), offline_detection=False)  # offline only when an agent says it stops
    excluded = {EXCLUDE: f"until={at(100).isoformat()};rules=other"}
    core.step(kube_job(0, "n1", excluded), at(0))
    core.step(kube_job(5, "n2", excluded), at(5))
    assert [(i.rule, i.status) for i in core.open_incidents()] == [("job-excluded", "firing")]
    core.step(agent("agent.stopping", 10), at(10))  # n1, the job's head node, is offline
    core.step(Tick(), at(100))  # the exclusion ends; the job is not evaluated while its head node is offline
    out = core.step(agent("agent.started", 110, "n2"), at(110))  # n2's event: a full evaluation sees it end
    assert moved(out) == [("job-excluded", "job/kubernetes/ml/Deployment/chat", "resolved", "condition")]
