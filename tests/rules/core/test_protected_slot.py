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


def test_a_runners_refusal_that_frees_its_slot_lets_the_next_target_run(tmp_path: Path) -> None:
    from gpuevents.records import AuditRecord
    from rules.core.core import ActionOutcome

    core = Core(rules_from(tmp_path, RULE))

    def snap(t: float, ns: str) -> SnapshotEvent:
        return SnapshotEvent(source="node/n1", time=at(t), data=NodeSnapshot(
            node=NodeInfo(name="n1"), gpus=[GpuInfo(node="n1", index=0, util_pct=0, idle=True, idle_since=at(0))],
            jobs=[JobInfo(id=f"{ns}/Deployment/web", scheduler="kubernetes", namespace=ns, gpus=[0])]))

    [first] = core.step(snap(0, "a"), at(0)).actions
    assert first.decision == "run"
    # the runner found no pod of it on n1: refused, audited with slot_freed, fed back as the engine reads it
    record = AuditRecord(time=at(5), kind="action", rule="pruner", entity_id=first.entity_id,
                         incident_id=first.incident_id, action_type="pause", action_key=first.key,
                         outcome="refused", error="contradicted at the source of truth (n1): …", slot_freed=True)
    outcome = ActionOutcome.of(record)
    assert outcome is not None and outcome.slot_freed
    core.step(outcome, at(5))
    second = [r for r in core.step(snap(10, "b"), at(10)).actions if r.entity_id.endswith("b/Deployment/web")]
    assert [r.decision for r in second] == ["run"]  # without the slot back: suppressed (max_per_hour 1)
