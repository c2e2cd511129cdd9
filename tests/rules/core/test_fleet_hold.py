"""max_fleet_pct stays a breaker but never silent nor forever (DESIGN §3.4): with `engine.holds.channel` the held
actions of one outbreak share one question to the platform channel, saying what is held and why; a `fleet_floor`
lets a small fleet reclaim its few."""

from __future__ import annotations

from pathlib import Path

from gpuevents.config import Config
from gpuevents.events import GpuInfo, JobInfo, NodeInfo, NodeSnapshot, SnapshotEvent
from gpuevents.records import ActionRequest
from rules.core.core import Core
from tests.rules.helpers import at, rules_from

RULE = """\
rules:
  - name: pruner
    entity: job
    when: job.scheduler == 'kubernetes' and job.idle
    for: 2h
    limits: {{max_fleet_pct: 50{floor}}}
    actions:
      - {{type: pause}}
"""


def snap(t: float, idle: list[bool]) -> SnapshotEvent:
    gpus = [GpuInfo(node="n1", index=i, util_pct=0 if quiet else 90, idle=quiet,
                    idle_since=at(0) if quiet else None) for i, quiet in enumerate(idle)]
    jobs = [JobInfo(id=f"ml-dev/Deployment/w{i}", scheduler="kubernetes", namespace="ml-dev", gpus=[i])
            for i in range(len(idle))]
    return SnapshotEvent(source="node/n1", time=at(t), data=NodeSnapshot(node=NodeInfo(name="n1"), gpus=gpus,
                                                                          jobs=jobs))


def run(core: Core, idle: list[bool], until: float, start: float = 0) -> list[ActionRequest]:
    out: list[ActionRequest] = []
    t = start
    while t <= until:
        out += core.step(snap(t, idle), at(t)).actions
        t += 600
    return out


def test_six_of_six_idle_ask_the_platform_channel_once_for_the_outbreak(tmp_path: Path) -> None:
    cfg = Config.model_validate({"engine": {"holds": {"channel": "#gpu-platform"}}})
    core = Core(rules_from(tmp_path, RULE.format(floor="")), cfg)
    asked = run(core, [True] * 6, 3 * 3600)  # six idle workloads for three hours
    assert len(asked) == 6 and {r.decision for r in asked} == {"run"}
    assert {r.approve for r in asked} == {"#gpu-platform"} and len({r.approval_key for r in asked}) == 1
    assert asked[0].reason == "6 of 6 jobs (100.0%) match pruner, over max_fleet_pct 50%"


def test_without_a_channel_the_hold_is_final_as_before(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, RULE.format(floor="")), Config())
    assert {r.decision for r in run(core, [True] * 6, 3 * 3600)} == {"held"}


def test_a_new_outbreak_asks_again(tmp_path: Path) -> None:
    cfg = Config.model_validate({"engine": {"holds": {"channel": "#gpu-platform"}}})
    core = Core(rules_from(tmp_path, RULE.format(floor="")), cfg)
    first = run(core, [True] * 4, 3 * 3600)
    run(core, [False] * 4, 4 * 3600, start=3 * 3600 + 600)  # busy again: nothing matches, the outbreak ends
    second = run(core, [True] * 4, 8 * 3600, start=4 * 3600 + 600)
    assert len(first) == 4 and len(second) == 4
    assert len({r.approval_key for r in first}) == 1 and len({r.approval_key for r in second}) == 1
    assert first[0].approval_key != second[0].approval_key


def test_a_small_fleet_reclaims_up_to_its_floor(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, RULE.format(floor=", fleet_floor: 2")), Config())
    two = run(core, [True, True, False, False], 3 * 3600)  # 2 of 4 is 50%; not over it anyway
    core3 = Core(rules_from(tmp_path, RULE.format(floor=", fleet_floor: 2"), name="b.yaml"), Config())
    three = run(core3, [True, True, True, False], 3 * 3600)  # 3 of 4: over 50% and over the floor
    core_small = Core(rules_from(tmp_path, RULE.format(floor=", fleet_floor: 3"), name="c.yaml"), Config())
    small = run(core_small, [True, True, True], 3 * 3600)  # 3 of 3 is 100%, but no more than the floor
    assert [r.decision for r in two] == ["run", "run"]
    assert [r.decision for r in three] == ["held"] * 3
    assert [r.decision for r in small] == ["run"] * 3
