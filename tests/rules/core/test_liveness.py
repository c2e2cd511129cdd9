"""Liveness: a node is offline after three missed snapshot intervals (at once when its agent says it stops) and
gone after the grace. Rules on `node.online` / `node.last_seen` are evaluated on offline nodes, so an "agent
down" rule fires; other rules keep the offline semantics (not evaluated, resolved as gone after the grace)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from gpuevents.config import Config
from gpuevents.events import AgentInfo, make_event
from rules.core.core import Core, Tick
from rules.core.incidents import Transition
from rules.lang.loader import load_rule_set, reads_liveness
from tests.rules.helpers import IDLE as IDLE_SLACK
from tests.rules.helpers import at, config, gpu, held_idle, idle_core, proc, rules_from, snapshot

LIBRARY = Path(__file__).resolve().parents[3] / "rules" / "library"
IDLE = """\
rules:
  - name: idle
    entity: gpu
    when: gpu.idle and gpu.processes
    actions: [{type: log, message: idle}]
"""


def offline_core(tmp_path: Path) -> Core:
    """The library's node-offline rule and an idle rule; snapshots every 15 s, offline after 45 s, grace 10 m."""
    files = [LIBRARY / "node-offline.yaml", tmp_path / "idle.yaml"]
    files[1].write_text(IDLE)
    return Core(load_rule_set(files), Config())


def run(core: Core, start: float, end: float, reporting: bool, step: float = 15) -> list[tuple[datetime, Transition]]:
    out = []
    t = start
    while t < end:
        if reporting:
            core.step(snapshot(at(t), gpus=[gpu(0)], processes=[proc(42)]), at(t))
        out += [(at(t), tr) for tr in core.step(Tick(), at(t)).transitions]
        t += step
    return out


def test_reads_liveness_finds_online_and_last_seen() -> None:
    assert reads_liveness("not node.online") and reads_liveness("node['last_seen'] is none")
    assert not reads_liveness("node.labels.env == 'dev'") and not reads_liveness("gpu.idle")


def test_an_agent_down_rule_fires_stays_past_the_grace_and_resolves_when_the_node_is_back(tmp_path: Path) -> None:
    core = offline_core(tmp_path)
    assert [r.name for r in core.rules if r.reads_liveness] == ["node-offline"]
    run(core, 0, 61, reporting=True)  # last snapshot at 60 s: offline from 105 s
    timeline = run(core, 75, 1200, reporting=False)
    got = [(t, tr.rule, tr.entity_id, tr.to_status, tr.reason) for t, tr in timeline]
    assert got[0] == (at(105), "node-offline", "n1", "pending", "")
    firing = [t for t, r, _, s, _ in got if r == "node-offline" and s == "firing"]
    assert firing and at(405) <= firing[0] <= at(420)
    # past offline_grace the idle incident ends as gone; the agent-down incident goes on
    assert ("idle", "n1/gpu0", "resolved", "gone") in [g[1:] for g in got]
    assert [i.rule for i in core.open_incidents()] == ["node-offline"]
    out = core.step(snapshot(at(1200), gpus=[gpu(0)], processes=[proc(42)]), at(1200))
    assert ("node-offline", "resolved", "condition") in [(t.rule, t.to_status, t.reason) for t in out.transitions]
    resolve = [a for a in out.actions if a.rule == "node-offline"]
    assert [(a.phase, a.type, a.params["to"]) for a in resolve] == [("resolve", "slack", "#gpu-infra")]
    assert "reports again" in resolve[0].params["text"]


def test_the_alert_names_the_node_and_when_it_was_last_seen(tmp_path: Path) -> None:
    core = offline_core(tmp_path)
    run(core, 0, 61, reporting=True)
    actions = []
    t = 75.0
    while t < 500:
        actions += core.step(Tick(), at(t)).actions
        t += 15
    (alert,) = [a for a in actions if a.rule == "node-offline"]
    assert alert.phase == "fire" and alert.entity_id == "n1"
    assert "Node n1 has not reported since 2026-01-05 00:01:00" in alert.params["text"]


def test_an_agent_that_says_it_stops_is_offline_at_once(tmp_path: Path) -> None:
    core = offline_core(tmp_path)
    run(core, 0, 31, reporting=True)
    out = core.step(make_event("agent.stopping", "n1", AgentInfo(node="n1", snapshot_interval_s=15), time=at(40)),
                    at(40))
    assert [(t.rule, t.to_status) for t in out.transitions] == [("node-offline", "pending")]


def test_a_node_that_keeps_reporting_never_fires_and_other_rules_skip_offline_nodes(tmp_path: Path) -> None:
    core = offline_core(tmp_path)
    assert all(tr.rule != "node-offline" for _, tr in run(core, 0, 900, reporting=True))
    core2 = Core(rules_from(tmp_path, IDLE.replace("gpu.idle and gpu.processes", "not gpu.idle"), name="b.yaml"))
    core2.step(snapshot(at(0), gpus=[gpu(0, 90)]), at(0))
    core2.step(Tick(), at(200))  # offline now; a non-liveness rule is not evaluated there
    assert [i.status for i in core2.open_incidents()] == ["firing"]


def test_missing_data_is_not_evidence_offline_nodes_neither_promote_nor_resolve(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, IDLE_SLACK.format(extra="for: 2m").replace("name: idle\n", "name: idle\n", 1)
                           + """\
  - name: fired
    entity: gpu
    when: gpu.idle
    actions: [{type: log, message: m}]
    on_resolve: [{type: log, message: gone}]
"""), config(offline_grace="10m"))
    core.step(held_idle(), at(0))
    core.step(Tick(), at(0))
    out = core.step(Tick(), at(46))  # three 15 s snapshot intervals without a snapshot
    assert core.nodes()[0].online is False and out.transitions == []
    out = core.step(Tick(), at(300))  # past `for`: not promoted while offline
    assert out.transitions == [] and {i.status for i in core.open_incidents()} == {"pending", "firing"}
    assert core.next_wakeup(at(300)) == at(330)  # an overdue deadline it cannot act on is no reason to spin
    out = core.step(Tick(), at(45 + 600))
    assert {(t.rule, t.to_status, t.reason) for t in out.transitions} == {("idle", "inactive", "gone"),
                                                                          ("fired", "resolved", "gone")}
    assert [(a.rule, a.phase) for a in out.actions] == [("fired", "resolve")]
    assert core.nodes() == [] and core.open_incidents() == []


def test_a_node_that_comes_back_resumes_its_incidents(tmp_path: Path) -> None:
    core = idle_core(tmp_path, "for: 2m")
    core.step(held_idle(), at(0))
    core.step(Tick(), at(100))
    assert core.nodes()[0].online is False
    out = core.step(held_idle(130), at(130))
    assert core.nodes()[0].online is True and [t.to_status for t in out.transitions] == ["firing"]


def test_agent_started_sets_the_snapshot_interval_for_online(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    core.step(make_event("agent.started", "n1", AgentInfo(node="n1", snapshot_interval_s=60), time=at(0)), at(0))
    core.step(held_idle(), at(0))
    core.step(Tick(), at(150))
    assert core.nodes()[0].online is True
    core.step(Tick(), at(181))
    assert core.nodes()[0].online is False
