"""on_resolve actions restore what firing did: never suppressed, held or counted by the limits; protection and
dry run still apply."""

from __future__ import annotations

from pathlib import Path

from gpuevents.config import Config
from rules.core.core import Core
from tests.rules.helpers import at, config, gpu, proc, rules_from, snapshot

CORDON = """\
rules:
  - name: hot
    entity: gpu
    when: gpu.util_pct > 50
    limits: {{max_per_hour: 2{pct}}}
    actions: [{{type: cordon}}]
    on_resolve: [{{type: uncordon}}]
"""


def test_a_rate_limited_rule_still_uncordons_when_it_resolves(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, CORDON.format(pct="")))
    core.step(snapshot(at(0), gpus=[gpu(0, 90)]), at(0))
    core.step(snapshot(at(10), gpus=[gpu(0, 0)]), at(10))
    out = core.step(snapshot(at(20), gpus=[gpu(0, 90)]), at(20))
    assert [(a.phase, a.decision) for a in out.actions] == [("fire", "run")]  # second run of the hour
    out = core.step(snapshot(at(30), gpus=[gpu(0, 0)]), at(30))
    assert [(a.type, a.phase, a.decision) for a in out.actions] == [("uncordon", "resolve", "run")]
    # the resolves were not counted: the hour's budget is still 2 firings, both used
    out = core.step(snapshot(at(40), gpus=[gpu(0, 90)]), at(40))
    assert [(a.phase, a.decision) for a in out.actions] == [("fire", "suppressed")]


def test_a_fleet_share_hold_does_not_hold_the_scale_back(tmp_path: Path) -> None:
    scale = "{type: scale, name: web, replicas: %s}"
    core = Core(rules_from(tmp_path, CORDON.format(pct=", max_fleet_pct: 10")
                           .replace("{type: cordon}", scale % 0).replace("{type: uncordon}", scale % "previous")))
    out = core.step(snapshot(at(0), gpus=[gpu(0, 90), gpu(1, 0)]), at(0))
    assert [a.decision for a in out.actions] == ["held"]  # 1 of 2 GPUs: 50% > 10%
    core.step(snapshot(at(5), gpus=[gpu(0, 90), gpu(1, 90)]), at(5))
    out = core.step(snapshot(at(10), gpus=[gpu(0, 0), gpu(1, 90)]), at(10))
    assert [(a.type, a.params.get("replicas"), a.decision) for a in out.actions] == [("scale", "previous", "run")]


def test_engine_limits_do_not_apply_to_the_resolve_phase(tmp_path: Path) -> None:
    cfg = Config.model_validate({"engine": {"limits": {"uncordon": {"max_per_hour": 0, "max_fleet_pct": 0}}}})
    core = Core(rules_from(tmp_path, CORDON.format(pct="")), cfg)
    core.step(snapshot(at(0), gpus=[gpu(0, 90)]), at(0))
    out = core.step(snapshot(at(10), gpus=[gpu(0, 0)]), at(10))
    assert [(a.type, a.decision) for a in out.actions] == [("uncordon", "run")]


def test_protection_and_dry_run_still_apply_to_the_resolve_phase(tmp_path: Path) -> None:
    rules = rules_from(tmp_path, """\
rules:
  - name: k
    entity: process
    when: process.name == 'x'
    actions: [{type: log, message: m}]
    on_resolve: [{type: kill}, {type: log, message: r}]
""")
    core = Core(rules)
    core.step(snapshot(at(0), gpus=[gpu(0)], processes=[proc(1, user="root", name="x")]), at(0))
    out = core.step(snapshot(at(10), gpus=[gpu(0)], processes=[proc(1, user="root", name="y")]), at(10))
    assert [(a.type, a.decision) for a in out.actions] == [("kill", "refused"), ("log", "run")]
    assert "protected" in (out.actions[0].reason or "")
    dry = Core(rules, config(dry_run=True))
    dry.step(snapshot(at(0), gpus=[gpu(0)], processes=[proc(1, user="root", name="x")]), at(0))
    out = dry.step(snapshot(at(10), gpus=[gpu(0)], processes=[proc(1, user="root", name="y")]), at(10))
    assert [(a.type, a.decision) for a in out.actions] == [("kill", "refused"), ("log", "dry_run")]
