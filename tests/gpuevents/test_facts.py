"""The facts of an action request: one typed model, written by the core, with the JSON it always had."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gpuevents.commands import kill_targets
from gpuevents.facts import Facts, ProcessFacts
from gpuevents.records import ActionRequest
from tests.rules.helpers import T0, at, held_idle, idle_core

OLD_GPU_FACTS: dict[str, Any] = {
    "node": {"cluster": "default", "labels": {}, "name": "n1", "online": True},
    "gpu": {"allocated": None, "idle": True, "idle_for_s": 0.0, "idle_since": "2026-01-05T00:00:00+00:00", "index":
        0, "job": None, "mem_total_mib": 81559.0, "mem_used_mib": None, "model": None, "node": "n1", "owner": "alice",
        "power_w": None, "temp_c": None, "util_pct": 0.0, "uuid": "", "xid": None, "xid_at": None},
    "processes": [{"age_s": 0.0, "cmdline": "", "create_time": "2026-01-05T00:00:00+00:00", "exe": "", "gpus": [0],
        "job": None, "name": "train.py", "node": "n1", "owner": "alice", "pid": 42, "pod": None, "user": "alice"}],
    "owners": ["alice"],
    "incident": {"active_for": "0s", "count": 1, "firing_for": "0s", "firing_since": "2026-01-05T00:00:00+00:00",
        "id": "i1", "kept_until": None, "next": None, "resolve_reason": None, "resolved_by": None, "started_at":
        "2026-01-05T00:00:00+00:00"},
    "cost": {"amount": 0.0, "currency": "USD", "per_hour": 0.7975, "text": "$0.00"},
}
"""What the engine wrote for a gpu rule's request before the facts had a model (the incident id aside)."""

OLD_JOB_FACTS: dict[str, Any] = {
    "node": {"name": "k1", "cluster": "default", "labels": {"team": "a"}, "online": True},
    "job": {"id": "a/Deployment/llm", "scheduler": "kubernetes", "name": None, "user": None, "owner": "bob",
            "account": None, "partition": None, "qos": None, "namespace": "a", "controller": "Deployment/llm",
            "nodes": ["k1"], "gpu_count": 1, "pods": ["a/llm-0"], "controller_uid": "u1",
            "controller_generation": 3, "annotations": {}},
    "gpus": [], "processes": [], "owners": [], "cost": {"amount": 1.5, "currency": "USD", "text": "$1.50",
                                                        "per_hour": 0.8},
    "incident": {"id": "i1", "started_at": "2026-01-05T00:00:00+00:00", "firing_since": None, "firing_for": "",
                 "active_for": "0s", "count": 1, "next": {"type": "kill", "at": "2026-01-05T01:00:00+00:00",
                                                          "in": "1h", "says": ""},
                 "resolve_reason": None, "resolved_by": None, "kept_until": None},
    "requested_by": "ops", "added_later": {"kept": True},
}


def test_the_core_writes_the_json_it_always_wrote(tmp_path: Path) -> None:
    (req,) = idle_core(tmp_path).step(held_idle(), at(0)).actions
    facts = json.loads(req.model_dump_json())["facts"]
    assert facts == {**OLD_GPU_FACTS, "incident": {**OLD_GPU_FACTS["incident"], "id": req.incident_id}}
    assert isinstance(req.facts, Facts) and req.facts.processes[0].create_time == T0  # typed for the readers


@pytest.mark.parametrize("old", [OLD_GPU_FACTS, OLD_JOB_FACTS], ids=["gpu", "job"])
def test_a_request_from_nats_reads_and_writes_back_unchanged(old: dict[str, Any]) -> None:
    raw = json.dumps({"key": "k", "type": "log", "params": {}, "rule": "r", "entity_id": "e", "entity_kind": "gpu",
                      "incident_id": "i1", "created_at": "2026-01-05T00:00:00+00:00", "facts": old})
    req = ActionRequest.model_validate_json(raw)
    assert json.loads(req.model_dump_json())["facts"] == old
    assert req.facts.get("processes") == old["processes"] and req.facts["node"] == old["node"]  # the dict form


def test_the_job_part_is_typed_and_unknown_keys_are_kept() -> None:
    facts = Facts.model_validate(OLD_JOB_FACTS)
    assert facts.job is not None and (facts.job.controller_uid, facts.job.pods) == ("u1", ["a/llm-0"])
    assert facts.incident is not None and facts.incident.next is not None and facts.incident.next.in_ == "1h"
    assert facts.model_extra == {"added_later": {"kept": True}}


def test_kill_targets_need_a_pid_and_a_create_time() -> None:
    one = ProcessFacts(pid=7, create_time=T0, user="alice")
    assert [(t.pid, t.user) for t in kill_targets(Facts(process=one))] == [(7, "alice")]
    assert kill_targets(Facts(processes=[one, one.model_copy(update={"pid": 8})]))[1].pid == 8
    with pytest.raises(ValidationError):
        kill_targets(Facts(processes=[ProcessFacts(pid=9)]))
