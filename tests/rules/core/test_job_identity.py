"""A job's identity includes its top owner's uid (DESIGN §3.4): a workload deleted and created again under the same
name is a new entity, with the same id, whose incident starts from zero."""

from __future__ import annotations

from pathlib import Path

from gpuevents.events import GpuInfo, JobInfo, NodeInfo, NodeSnapshot, SnapshotEvent
from rules.core.core import Core
from rules.core.incidents import Transition
from tests.rules.helpers import at, rules_from

RULE = """\
rules:
  - name: pruner
    entity: job
    when: job.scheduler == 'kubernetes' and job.idle
    for: 10m
    actions:
      - {type: log, message: "pause {{ job.id }}"}
"""


def snap(t: float, uid: str) -> SnapshotEvent:
    return SnapshotEvent(source="node/n1", time=at(t), data=NodeSnapshot(
        node=NodeInfo(name="n1"), gpus=[GpuInfo(node="n1", index=0, util_pct=0, idle=True, idle_since=at(0))],
        jobs=[JobInfo(id="ml-dev/Deployment/web", scheduler="kubernetes", namespace="ml-dev",
                      controller="Deployment/web", controller_uid=uid, gpus=[0])]))


def test_a_workload_created_again_under_its_name_starts_a_new_incident(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, RULE))
    seen: list[Transition] = []
    for t in range(0, 12 * 60 + 1, 30):  # the first Deployment, idle: firing at 10 minutes
        seen += core.step(snap(t, "uid-1"), at(t)).transitions
    assert [(x.to_status, x.entity_id) for x in seen] == [
        ("pending", "job/kubernetes/ml-dev/Deployment/web"), ("firing", "job/kubernetes/ml-dev/Deployment/web")]
    seen.clear()
    for t in range(13 * 60, 20 * 60 + 1, 30):  # deleted and created again, idle from its start: 7 minutes
        seen += core.step(snap(t, "uid-2"), at(t)).transitions
    assert [(x.from_status, x.to_status) for x in seen] == [("firing", "resolved"), ("inactive", "pending")]
    assert seen[1].entity_id == "job/kubernetes/ml-dev/Deployment/web" and seen[1].time == at(13 * 60)
    [open_] = core.open_incidents()
    assert open_.status == "pending" and open_.entity_key.endswith("@uid-2")
