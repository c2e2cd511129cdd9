"""The read side's accessor into a real core: node keys, a node's readings with `online` and `last_seen`, a node
forgotten since its key was read, the open incidents a rule at a time, an incident's context (severity, owner,
model, power), no demand or exemptions when none were reported."""

from __future__ import annotations

from pathlib import Path

from gpuevents.config import Config
from rules.core.core import Core
from rules.engine.read.readings import (
    demand_lines,
    exemption_views,
    incident_context,
    node_keys,
    node_reading,
    open_incidents,
)
from tests.rules.helpers import T0, at, gpu, proc, rules_from, snapshot

RULES = """\
rules:
  - name: idle
    entity: gpu
    when: gpu.idle and gpu.processes
    labels: {severity: warning}
    actions: [{type: log, message: "{{ entity.id }}"}]
  - name: hot
    entity: gpu
    when: gpu.util_pct > 50
    actions: [{type: log, message: "{{ entity.id }}"}]
"""


def fleet(tmp_path: Path) -> Core:
    core = Core(rules_from(tmp_path, RULES), Config())
    core.step(snapshot(at(0), gpus=[gpu(0, model="NVIDIA H100 80GB HBM3", power_w=71.5), gpu(1, 90)],
                       processes=[proc(42)]), at(0))
    core.step(snapshot(at(5), node="n2", gpus=[gpu(0, 90)], processes=[proc(7, user="bob")]), at(5))
    return core


def test_each_node_reads_its_info_with_online_and_last_seen_and_its_readings(tmp_path: Path) -> None:
    core = fleet(tmp_path)
    keys = node_keys(core)
    assert len(keys) == 2
    readings = {r.node.name: r for r in (node_reading(core, k) for k in keys) if r is not None}
    n1 = readings["n1"]
    assert (n1.node.online, n1.node.last_seen) == (True, at(0))
    assert [g.index for g in n1.gpus] == [0, 1] and [p.pid for p in n1.processes] == [42]
    assert readings["n2"].node.last_seen == at(5) and readings["n2"].processes[0].user == "bob"
    assert node_reading(core, "no-such-node") is None


def test_open_incidents_come_a_rule_at_a_time_with_their_context(tmp_path: Path) -> None:
    core = fleet(tmp_path)
    by_rule = {incs[0].rule: sorted(i.entity_id for i in incs) for incs in open_incidents(core) if incs}
    assert by_rule == {"idle": ["n1/gpu0"], "hot": ["n1/gpu1", "n2/gpu0"]}
    [idle] = [i for incs in open_incidents(core) for i in incs if i.rule == "idle"]
    ctx = incident_context(core, idle)
    assert (ctx.severity, ctx.owner, ctx.model, ctx.power_w, ctx.warning) == \
        ("warning", "alice", "NVIDIA H100 80GB HBM3", 71.5, None)
    [hot] = [i for incs in open_incidents(core) for i in incs if i.entity_id == "n2/gpu0"]
    assert incident_context(core, hot).severity is None


def test_no_demand_or_exemptions_when_none_were_reported(tmp_path: Path) -> None:
    core = fleet(tmp_path)
    assert demand_lines(core, T0) == [] and exemption_views(core, T0) == []
