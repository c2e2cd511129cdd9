"""Warn before you act (DESIGN §5): a staged destructive action runs only if its incident's warning was delivered."""

from __future__ import annotations

from pathlib import Path

from gpuevents.config import Config, ProtectConfig
from gpuevents.events import JobInfo, SnapshotEvent
from gpuevents.records import ActionRequest, Outcome
from rules.core.core import ActionOutcome, Core, StepResult, Tick
from rules.core.incidents import Incident
from rules.core.warning_ledger import NOT_DELIVERED
from rules.lang.loader import load_rule_set
from tests.rules.helpers import T0, at, gpu, proc, rules_from, snapshot, with_data

LIBRARY = Path(__file__).resolve().parents[3] / "rules" / "library"

WARN_THEN_KILL = """\
rules:
  - name: idle-then-kill
    entity: gpu
    when: gpu.idle and gpu.processes
    actions:
      - {{type: slack, to: "{{{{ gpu.owner }}}}", text: "GPU {{{{ gpu.index }}}} idle; killed in 30m"}}
      - {{type: kill, after: 30m{extra}}}
"""


NO_PROTECTED_USERS = Config(protect=ProtectConfig(users=[]))
"""So a process with no user may be killed: what stops the kill below is the warning, not protection."""


def warn_then_kill(tmp_path: Path, extra: str = "") -> Core:
    return Core(rules_from(tmp_path, WARN_THEN_KILL.format(extra=extra)), NO_PROTECTED_USERS,
                offline_detection=False)


def held_by(user: str | None) -> SnapshotEvent:
    return snapshot(at(0), gpus=[gpu(0), gpu(1, 90)], processes=[proc(42, user=user)])


def fired(core: Core, user: str | None = "alice") -> ActionRequest:
    (warning,) = core.step(held_by(user), at(0)).actions
    assert warning.type == "slack"
    return warning


def report(core: Core, warning: ActionRequest, outcome: Outcome, t: float = 60) -> StepResult:
    return core.step(ActionOutcome(rule=warning.rule, incident_id=warning.incident_id, key=warning.key,
                                   outcome=outcome), at(t))


def staged(core: Core) -> ActionRequest:
    (kill,) = [a for a in core.step(Tick(), at(1800)).actions if a.type == "kill"]
    return kill


def test_a_delivered_warning_lets_the_staged_kill_run(tmp_path: Path) -> None:
    core = warn_then_kill(tmp_path)
    warning = fired(core)
    assert warning.decision == "run"
    (persisted,) = report(core, warning, "ok").incidents
    assert persisted.warnings[warning.key].status == "delivered"
    assert staged(core).decision == "run"


def test_a_warning_that_failed_refuses_the_staged_kill_and_the_incident_says_so(tmp_path: Path) -> None:
    core = warn_then_kill(tmp_path)
    warning = fired(core)
    report(core, warning, "failed")
    kill = staged(core)
    assert (kill.decision, kill.reason) == ("refused", f"{NOT_DELIVERED} (slack failed)")
    (incident,) = core.open_incidents()
    assert {k: w.status for k, w in incident.warnings.items()} == {warning.key: "failed"}


def test_a_warning_whose_outcome_is_not_known_at_the_stage_counts_as_not_delivered(tmp_path: Path) -> None:
    core = warn_then_kill(tmp_path)
    fired(core)
    kill = staged(core)
    assert (kill.decision, kill.reason) == ("refused", f"{NOT_DELIVERED} (slack with no outcome known)")


def test_a_late_success_wins_over_an_earlier_failure(tmp_path: Path) -> None:
    core = warn_then_kill(tmp_path)
    warning = fired(core)
    report(core, warning, "ok", t=30)
    report(core, warning, "failed", t=60)  # a redelivered, older record: a delivered warning stays delivered
    assert staged(core).decision == "run"


def test_a_warning_the_engine_refused_refuses_the_staged_kill(tmp_path: Path) -> None:
    core = warn_then_kill(tmp_path)
    warning = fired(core, user=None)  # no owner: the DM's `to` renders empty
    assert warning.decision == "refused"
    kill = staged(core)
    assert (kill.decision, kill.reason) == ("refused", f"{NOT_DELIVERED} (slack refused)")


def test_require_warning_false_opts_out(tmp_path: Path) -> None:
    core = warn_then_kill(tmp_path, extra=", require_warning: false")
    fired(core, user=None)
    assert staged(core).decision == "run"


def test_an_incident_that_sent_no_warning_is_not_concerned(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: quiet-kill
    entity: gpu
    when: gpu.idle and gpu.processes
    actions: [{type: log, message: noted}, {type: kill, after: 30m}]
"""), offline_detection=False)
    core.step(held_by("alice"), at(0))
    assert staged(core).decision == "run"


def test_the_warnings_survive_a_restart(tmp_path: Path) -> None:
    core = warn_then_kill(tmp_path)
    warning = fired(core)
    report(core, warning, "refused")
    stored = [Incident.model_validate_json(i.model_dump_json()) for i in core.open_incidents()]
    again = warn_then_kill(tmp_path)
    again.restore(stored, now=at(600))
    again.step(held_by("alice"), at(615))
    kill = staged(again)
    assert (kill.decision, kill.reason) == ("refused", f"{NOT_DELIVERED} (slack refused)")


def test_the_library_job_rule_does_not_cancel_a_job_whose_owner_could_not_be_mailed() -> None:
    core = Core(load_rule_set([LIBRARY / "jobs.yaml"]), offline_detection=False)
    job = JobInfo(id="81", gpus=[0], pids=[10], started_at=T0)  # no user: nobody to mail
    snap = snapshot(at(0), gpus=[gpu(0)], processes=[proc(10, user=None)])
    core.step(with_data(snap, jobs=[job]), at(0))
    for n in range(2, 7):  # busy jobs beside it: the idle one is under the rule's 20 % fleet share
        busy = snapshot(at(0), node=f"n{n}", gpus=[gpu(0, 90)])
        jobs = [JobInfo(id=f"9{n}", user="finn", gpus=[0], started_at=T0)]
        core.step(with_data(busy, jobs=jobs), at(0))
    def idle_job_actions(t: int) -> list[ActionRequest]:
        return [a for a in core.step(Tick(), at(t)).actions if a.rule == "job-idle-1h"]

    fire = [a for t in range(30, 3601 + 30, 30) for a in idle_job_actions(t)]
    assert [(a.type, a.decision) for a in fire] == [("email", "refused")]
    stage = [a for t in range(3630, 7200 + 60, 30) for a in idle_job_actions(t)]
    assert [(a.type, a.decision) for a in stage] == [("cancel", "refused"), ("email", "refused")]
    assert stage[0].reason == f"{NOT_DELIVERED} (email refused)"
