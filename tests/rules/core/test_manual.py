"""A person's kill or cancel decided like a rule's action (rules.core.manual): the target from the fleet state,
protection, engine.limits, engine.dry_run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuevents.config import Config
from gpuevents.events import JobInfo
from gpuevents.wire.manual import OperatorAction
from rules.core import manual
from rules.core.core import Core
from tests.rules.helpers import T0, at, gpu, idle_core, proc, snapshot, with_data


def core_with_a_process(tmp_path: Path, cfg: Config, user: str = "alice", name: str = "train.py",
                        labels: dict[str, str] | None = None) -> Core:
    tmp_path.mkdir(exist_ok=True)
    core = idle_core(tmp_path, cfg=cfg)
    core.step(snapshot(at(0), gpus=[gpu(0)], processes=[proc(4242, user=user, name=name)], labels=labels), at(0))
    return core


def kill(**kw: Any) -> OperatorAction:
    return OperatorAction.model_validate({"type": "kill", "cluster": "default", "node": "n1", "pid": 4242,
                                          "by": "ops", **kw})


def decide(core: Core, req: OperatorAction, cfg: Config) -> Any:
    ent = manual.find_target(core.state, req)
    assert ent is not None
    return manual.decide(req, ent, cfg, core.limiter, at(1), "id1")


def test_a_kill_names_the_process_and_carries_what_the_agent_checks(tmp_path: Path) -> None:
    cfg = Config()
    core = core_with_a_process(tmp_path, cfg)
    req = decide(core, kill(reason="stuck", signal="INT"), cfg)
    assert (req.decision, req.type, req.rule, req.entity_kind, req.node) == ("run", "kill", "operator", "process", "n1")
    assert req.params == {"signal": "INT", "grace": 30.0, "reason": "stuck"}
    assert req.facts["process"]["pid"] == 4242 and req.facts["processes"][0]["create_time"] == T0.isoformat()
    assert req.facts["requested_by"] == "ops" and req.key == "operator:id1"


def test_an_unknown_process_or_node_is_no_target(tmp_path: Path) -> None:
    core = core_with_a_process(tmp_path, Config())
    assert manual.find_target(core.state, kill(pid=1)) is None
    assert manual.find_target(core.state, kill(node="n2")) is None
    assert manual.find_target(core.state, kill(cluster="other")) is None
    assert "no process 1 on n1" in (manual.unknown_target(kill(pid=1)).error or "")


def test_protection_refuses_by_user_and_node_label(tmp_path: Path) -> None:
    cfg = Config.model_validate({"protect": {"users": ["root"], "node_labels": {"tier": "prod"}}})
    by_user = decide(core_with_a_process(tmp_path / "a", cfg, user="root"), kill(), cfg)
    assert (by_user.decision, by_user.reason) == ("refused", "protected: user root (pid 4242)")
    by_label = decide(core_with_a_process(tmp_path / "b", cfg, labels={"tier": "prod"}), kill(), cfg)
    assert by_label.decision == "refused" and "tier=prod" in (by_label.reason or "")


def test_engine_limits_count_a_persons_kills_and_suppress_past_them(tmp_path: Path) -> None:
    cfg = Config.model_validate({"engine": {"limits": {"kill": {"max_per_hour": 1}}}})
    core = core_with_a_process(tmp_path, cfg)
    first, second = decide(core, kill(), cfg), decide(core, kill(), cfg)
    assert first.decision == "run" and core.limiter.dirty
    assert second.decision == "suppressed" and "max_per_hour" in (second.reason or "")


def test_dry_run_decides_dry_run_and_counts_nothing(tmp_path: Path) -> None:
    cfg = Config.model_validate({"engine": {"dry_run": True, "limits": {"kill": {"max_per_hour": 1}}}})
    core = core_with_a_process(tmp_path, cfg)
    req = decide(core, kill(), cfg)
    assert (req.decision, req.dry_run) == ("dry_run", True)
    assert decide(core, kill(), cfg).decision == "dry_run"  # no run counted against the limit


@pytest.mark.parametrize("fields", [{"type": "kill", "node": "n1"}, {"type": "cancel"},
                                    {"type": "kill", "node": "n1", "pid": 0}, {"type": "stop", "job": "1"}])
def test_a_request_without_its_target_is_refused_at_the_boundary(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        OperatorAction.model_validate({"cluster": "c1", "by": "ops", **fields})


@pytest.mark.parametrize("scheduler", ["slurm", "kubernetes"])
def test_a_cancel_names_the_job_and_its_scheduler(tmp_path: Path, scheduler: str) -> None:
    cfg = Config()
    core = idle_core(tmp_path, cfg=cfg)
    job = JobInfo(id="ns/train-0" if scheduler == "kubernetes" else "7", scheduler=scheduler, user="erin",
                  gpus=[0], pids=[4242])
    snap = snapshot(at(0), gpus=[gpu(0)], processes=[proc(4242, user="erin")])
    core.step(with_data(snap, jobs=[job]), at(0))
    req = OperatorAction(type="cancel", cluster="default", job=job.id, by="ops")
    decided = decide(core, req, cfg)
    assert (decided.type, decided.entity_kind, decided.decision) == ("cancel", "job", "run")
    assert decided.params == {"provider": scheduler, "job": job.id}
    assert decided.facts["job"]["user"] == "erin"
    assert manual.find_target(core.state, req.model_copy(update={"job": "other"})) is None


def test_a_persons_cordon_names_the_node_and_is_limited_like_a_rules(tmp_path: Path) -> None:
    cfg = Config.model_validate({"engine": {"limits": {"cordon": {"max_per_hour": 1}}}})
    core = core_with_a_process(tmp_path, cfg)
    req = OperatorAction(type="cordon", cluster="default", node="n1", by="ops", reason="bad ECC")
    first = decide(core, req, cfg)
    assert (first.type, first.entity_kind, first.entity_id, first.decision) == ("cordon", "node", "n1", "run")
    assert first.params == {"provider": "kubernetes", "node": "n1", "reason": "bad ECC"} and first.destructive
    assert decide(core, req, cfg).decision == "suppressed"


def test_an_undo_is_never_limited_and_needs_no_entity_the_engine_sees(tmp_path: Path) -> None:
    """A paused workload has no pods, so the engine sees no job: resume names it, and the runner works from the
    workload's annotations; the limits that hold a remedy never hold its undo."""
    cfg = Config.model_validate({"engine": {"limits": {"resume": {"max_per_hour": 0},
                                                       "uncordon": {"max_per_hour": 0}}}})
    core = core_with_a_process(tmp_path, cfg)
    resume = OperatorAction(type="resume", cluster="default", job="ml/Deployment/trainer", by="ops")
    assert manual.find_target(core.state, resume) is None
    decided = manual.decide(resume, None, cfg, core.limiter, at(1), "id2")
    assert (decided.decision, decided.destructive, decided.entity_id) == ("run", False, "job/kubernetes/ml/"
                                                                          "Deployment/trainer")
    assert decided.params == {"job": "ml/Deployment/trainer"}
    assert decided.facts["job"] == {"id": "ml/Deployment/trainer", "scheduler": "kubernetes"}
    uncordon = OperatorAction(type="uncordon", cluster="default", node="n1", by="ops")
    assert manual.decide(uncordon, manual.find_target(core.state, uncordon), cfg, core.limiter, at(1),
                         "id3").decision == "run"
    dry = Config.model_validate({"engine": {"dry_run": True}})
    assert manual.decide(resume, None, dry, core.limiter, at(1), "id4").decision == "dry_run"


@pytest.mark.parametrize("fields", [{"type": "pause", "job": "trainer"}, {"type": "resume"},
                                    {"type": "cordon"}, {"type": "pause", "job": "ml/Deployment/x;rm"}])
def test_a_remedy_without_its_target_is_refused_at_the_boundary(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        OperatorAction.model_validate({"cluster": "c1", "by": "ops", **fields})
