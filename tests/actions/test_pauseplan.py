"""What pause changes per kind of workload, and what resume sets back: exactly the fields pause changed, never a
field someone changed since."""

from __future__ import annotations

from typing import Any

import pytest

from actions.pauseplan import Change, describe, merge_patch, pause_changes, resume_changes
from gpuevents.kubekinds import KINDS, kind_of, split_job_id

NOW = "2026-12-03T10:00:00Z"


@pytest.mark.parametrize(("kind", "obj", "change"), [
    ("Deployment", {"spec": {"replicas": 3}}, Change(path=["spec", "replicas"], before=3, after=0)),
    ("Deployment", {"spec": {}}, Change(path=["spec", "replicas"], before=None, after=0)),  # defaulted: 1
    ("StatefulSet", {"spec": {"replicas": 2}}, Change(path=["spec", "replicas"], before=2, after=0)),
    ("LeaderWorkerSet", {"spec": {"replicas": 4}}, Change(path=["spec", "replicas"], before=4, after=0)),
    ("Job", {"spec": {"suspend": False}}, Change(path=["spec", "suspend"], before=False, after=True)),
    ("CronJob", {"spec": {}}, Change(path=["spec", "suspend"], before=None, after=True)),
    ("JobSet", {"spec": {}}, Change(path=["spec", "suspend"], before=None, after=True)),
    ("RayCluster", {"spec": {"suspend": False}}, Change(path=["spec", "suspend"], before=False, after=True)),
    ("PyTorchJob", {"spec": {"runPolicy": {}}}, Change(path=["spec", "runPolicy", "suspend"], after=True)),
    ("Notebook", {"metadata": {"annotations": {"a": "b"}}},
     Change(path=["metadata", "annotations", "kubeflow-resource-stopped"], after=NOW)),
    ("InferenceService", {"spec": {"predictor": {"minReplicas": 2}}},
     Change(path=["spec", "predictor", "minReplicas"], before=2, after=0)),
])
def test_each_kind_is_stopped_its_own_way_and_resume_sets_back_exactly(kind: str, obj: dict[str, Any],
                                                                       change: Change) -> None:
    changes = pause_changes(KINDS[kind], obj, NOW)
    assert changes == [change]
    paused = merge_patch([(c.path, c.after) for c in changes])
    undo, left = resume_changes(changes, _apply(obj, paused))
    assert left == []
    assert merge_patch([(c.path, c.after) for c in undo]) == merge_patch([(change.path, change.before)])


def _apply(obj: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(obj)
    for k, v in patch.items():
        if isinstance(v, dict):
            out[k] = _apply(out.get(k) or {}, v)
        elif v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def test_a_stopped_workload_is_not_changed_again() -> None:
    assert pause_changes(KINDS["Deployment"], {"spec": {"replicas": 0}}, NOW) == []
    assert pause_changes(KINDS["Job"], {"spec": {"suspend": True}}, NOW) == []
    assert pause_changes(KINDS["Notebook"], {"metadata": {"annotations": {"kubeflow-resource-stopped": "x"}}},
                         NOW) == []


def test_resume_leaves_a_field_someone_changed_since() -> None:
    changes = [Change(path=["spec", "replicas"], before=3, after=0)]
    undo, left = resume_changes(changes, {"spec": {"replicas": 5}})  # a person scaled it up meanwhile
    assert undo == [] and "left as it is" in left[0]
    undo, left = resume_changes(changes, {"spec": {"replicas": 3}})  # already back: nothing to do, nothing said
    assert undo == [] and left == []


def test_kinds_without_a_way_to_pause_and_unknown_kinds() -> None:
    with pytest.raises(ValueError, match="DaemonSet has no way"):
        pause_changes(KINDS["DaemonSet"], {}, NOW)
    k = kind_of("acme.io/v2", "Trainer")
    assert (k.group, k.version, k.plural, k.pause) == ("acme.io", "v2", "trainers", None)
    assert kind_of("apps/v1", "Deployment") is KINDS["Deployment"]
    assert kind_of("kubeflow.org/v2beta1", "MPIJob").pause == "run_policy"


def test_job_ids() -> None:
    assert split_job_id("team-a/Deployment/llm") == ("team-a", "Deployment", "llm")
    assert split_job_id("team-a/llm-0") is None and split_job_id("12345") is None
    assert describe([Change(path=["spec", "replicas"], before=3, after=0)]) == "spec.replicas 3 -> 0"


def test_the_job_to_pause_comes_from_the_job_or_the_gpus_or_processes_job() -> None:
    from actions.builtin.pause import job_of
    from gpuevents.facts import Facts

    f = Facts.model_validate

    job, facts = job_of(None, f({"job": {"id": "a/Deployment/d", "scheduler": "kubernetes", "controller_uid": "u1",
                                          "pods": ["d-1"]}}))
    assert job == "a/Deployment/d" and facts.controller_uid == "u1" and facts.pods == ["d-1"]
    assert job_of(None, f({"gpu": {"job": "a/Notebook/nb"}}))[0] == "a/Notebook/nb"
    assert job_of(None, f({"process": {"job": "a/Job/train"}}))[0] == "a/Job/train"
    assert job_of(None, f({"gpu": {"job": "12345"}}))[0] is None  # a Slurm job: nothing to pause
    assert job_of("b/StatefulSet/s", f({"gpu": {"job": "a/Job/train"}}))[0] == "b/StatefulSet/s"
