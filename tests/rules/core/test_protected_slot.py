"""A refusal for protection takes no max_per_hour slot (DESIGN §3.4): a pause of a job in a protected namespace is
refused where the decision is made, before the rule's hourly budget counts it, so the real targets still run."""

from __future__ import annotations

from pathlib import Path

from gpuevents.config import Config
from gpuevents.events import GpuInfo, JobInfo, NodeInfo, NodeSnapshot, SnapshotEvent
from rules.core.core import Core
from tests.rules.helpers import at, rules_from

RULE = """\
rules:
  - name: pruner
    entity: job
    when: job.scheduler == 'kubernetes' and job.idle
    limits: {max_per_hour: 1}
    actions:
      - {type: pause}
"""


def test_a_protected_job_refused_leaves_the_slot_to_the_next_one(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, RULE), Config.model_validate({"protect": {"namespaces": ["kube-system"]}}))
    jobs = [JobInfo(id=f"{ns}/Deployment/{name}", scheduler="kubernetes", namespace=ns, gpus=[i])
            for i, (ns, name) in enumerate([("kube-system", "dns"), ("ml-dev", "web")])]
    gpus = [GpuInfo(node="n1", index=i, util_pct=0, idle=True, idle_since=at(0)) for i in range(2)]
    out = core.step(SnapshotEvent(source="node/n1", time=at(0), data=NodeSnapshot(
        node=NodeInfo(name="n1"), gpus=gpus, jobs=jobs)), at(0))
    decided = sorted((r.entity_id, r.decision, r.reason or "") for r in out.actions)
    assert decided == [
        ("job/kubernetes/kube-system/Deployment/dns", "refused",
         "protected: namespace kube-system (job kube-system/Deployment/dns)"),
        ("job/kubernetes/ml-dev/Deployment/web", "run", "")]
