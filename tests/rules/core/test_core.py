"""The core: events and ticks in, transitions and action requests out; offline nodes, restarts, reloads, limits."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from gpuevents.config import Config
from gpuevents.events import AgentInfo, GpuEvent, ProcessEvent, make_event
from rules.core.core import Core, Snooze, Sweep, Tick
from tests.rules.helpers import T0, at, config, gpu, proc, rules_from, snapshot

IDLE = """\
rules:
  - name: idle
    entity: gpu
    when: gpu.idle and gpu.processes
    {extra}
    actions:
      - type: slack
        to: "{{{{ gpu.owner }}}}"
        text: "GPU {{{{ gpu.index }}}} held by {{{{ gpu.processes[0].name }}}} <b>"
    on_resolve:
      - type: log
        message: "{{{{ rule.name }}}} resolved on {{{{ entity.id }}}}"
"""


def idle_core(tmp_path: Path, extra: str = "", cfg: Config | None = None, **kw: object) -> Core:
    return Core(rules_from(tmp_path, IDLE.format(extra=extra)), cfg or Config(), **kw)  # type: ignore[arg-type]


def held_idle(t: float = 0, util: float = 0, name: str = "train.py", **kw: object):  # type: ignore[no-untyped-def]
    return snapshot(at(t), gpus=[gpu(0, util), gpu(1, 90)], processes=[proc(42, name=name)], **kw)  # type: ignore[arg-type]


def test_an_event_fires_a_rule_without_for_at_once(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    out = core.step(held_idle(), at(0))
    assert [(t.from_status, t.to_status) for t in out.transitions] == [("inactive", "pending"), ("pending", "firing")]
    (req,) = out.actions
    inc = out.incidents[-1]
    assert req.key == f"{inc.id}:fire:0:0"
    assert (req.type, req.decision, req.entity_id, req.node, req.phase) == ("slack", "run", "n1/gpu0", "n1", "fire")
    assert req.params == {"to": "alice", "text": "GPU 0 held by train.py <b>"}
    assert req.facts["processes"][0]["pid"] == 42 and req.facts["processes"][0]["create_time"] == T0.isoformat()
    assert req.facts["incident"]["id"] == inc.id and req.facts["cost"]["text"].startswith("$")


def test_values_from_the_machine_are_escaped_for_the_destination_but_the_authors_text_is_not(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    (req,) = core.step(held_idle(name="<!channel>"), at(0)).actions
    assert req.params["text"] == "GPU 0 held by &lt;!channel&gt; <b>"


def test_resolution_runs_on_resolve_and_the_next_true_is_a_new_incident(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    first = core.step(held_idle(), at(0)).incidents[-1]
    out = core.step(held_idle(60, util=90), at(60))
    assert [t.to_status for t in out.transitions] == ["resolved"]
    assert [(a.type, a.phase, a.params["message"]) for a in out.actions] == [("log", "resolve", "idle resolved on n1/gpu0")]
    again = core.step(held_idle(120), at(120)).incidents[-1]
    assert again.id != first.id and again.status == "firing"


def test_for_is_promoted_by_ticks_and_next_wakeup_names_the_deadline(tmp_path: Path) -> None:
    core = idle_core(tmp_path, "for: 2m")
    core.step(held_idle(), at(0))
    core.step(Tick(), at(0))
    assert core.next_wakeup(at(0)) == at(30)  # the tick comes first
    core.step(held_idle(100), at(100))
    core.step(Tick(), at(100))
    assert core.next_wakeup(at(100)) == at(120)  # the `for` deadline comes before the tick at 130
    out = core.step(Tick(), at(120))
    assert [t.to_status for t in out.transitions] == ["firing"] and len(out.actions) == 1


def test_a_tick_reevaluates_time_dependent_conditions_only(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: timed
    entity: gpu
    when: gpu.idle_for_s > 30
    actions: [{type: log, message: m}]
  - name: untimed
    entity: gpu
    when: gpu.util_pct > 50
    actions: [{type: log, message: m}]
"""))
    core.step(snapshot(at(0), gpus=[gpu(0, 0), gpu(1, 10)]), at(0))
    core.gpus()[1].util_pct = 99  # changed behind the core's back: no event, so no re-evaluation
    out = core.step(Tick(), at(40))
    assert {(t.rule, t.entity_id, t.to_status) for t in out.transitions if t.to_status == "firing"} == {("timed", "n1/gpu0", "firing")}


def test_missing_data_is_not_evidence_offline_nodes_neither_promote_nor_resolve(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, IDLE.format(extra="for: 2m").replace("name: idle\n", "name: idle\n", 1)
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
    assert {(t.rule, t.to_status, t.reason) for t in out.transitions} == {("idle", "inactive", "gone"), ("fired", "resolved", "gone")}
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


def test_restart_resumes_pending_and_does_not_fire_again(tmp_path: Path) -> None:
    rules = rules_from(tmp_path, IDLE.format(extra="for: 2h"))
    core = Core(rules)
    core.step(held_idle(), at(0))
    saved = core.open_incidents()
    assert [i.status for i in saved] == ["pending"]
    restarted = Core(rules)
    restarted.restore(saved, now=at(3600))
    restarted.step(held_idle(3600), at(3600))
    assert restarted.open_incidents() == saved  # still pending since 0, not since the restart
    restarted.step(held_idle(7190), at(7190))
    out = restarted.step(Tick(), at(7200))
    assert [t.to_status for t in out.transitions] == ["firing"]
    fired = restarted.open_incidents()
    again = Core(rules)
    again.restore(fired, now=at(7300))
    out = again.step(held_idle(7300), at(7300))
    assert out.actions == [] and again.open_incidents() == fired


def test_restored_incidents_of_entities_that_never_return_resolve_after_the_grace(tmp_path: Path) -> None:
    rules = rules_from(tmp_path, IDLE.format(extra=""))
    core = Core(rules)
    core.step(held_idle(), at(0))
    restarted = Core(rules, config(offline_grace="10m"))
    restarted.restore(core.open_incidents(), now=at(60))
    assert restarted.step(Tick(), at(120)).transitions == []
    out = restarted.step(Tick(), at(60 + 600))
    assert [(t.to_status, t.reason) for t in out.transitions] == [("resolved", "gone")]


def test_replacing_rules_keeps_incidents_of_unchanged_rules(tmp_path: Path) -> None:
    both = IDLE.format(extra="") + """\
  - name: hot
    entity: gpu
    when: gpu.util_pct >= 0
    actions: [{type: log, message: m}]
"""
    core = Core(rules_from(tmp_path, both))
    core.step(held_idle(), at(0))
    assert {i.rule for i in core.open_incidents()} == {"idle", "hot"}
    dropped = core.replace_rules(rules_from(tmp_path, both.replace("util_pct >= 0", "util_pct >= -1")))
    dropped = dropped.incidents  # the result of a reload: the closed incidents (and their transitions, actions)
    assert [i.rule for i in dropped] == ["hot", "hot"] and {i.rule for i in core.open_incidents()} == {"idle"}
    out = core.step(Tick(), at(10))  # changed rules are evaluated in full at the next tick
    assert {(t.rule, t.to_status) for t in out.transitions} == {("hot", "pending"), ("hot", "firing")}


def test_snooze_resolves_and_expiry_lets_it_fire_again(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    core.step(held_idle(), at(0))
    out = core.step(Snooze(rule="idle", entity_id="n1/gpu0", until=at(3600)), at(10))
    assert [(t.to_status, t.reason) for t in out.transitions] == [("resolved", "snoozed")]
    assert core.step(held_idle(20), at(20)).transitions == []
    core.step(held_idle(3590), at(3590))
    out = core.step(Tick(), at(3600))
    assert [t.to_status for t in out.transitions] == ["pending", "firing"]


def test_max_per_hour_suppresses_the_rest(tmp_path: Path) -> None:
    core = idle_core(tmp_path, "limits: {max_per_hour: 2}")
    out = core.step(snapshot(at(0), gpus=[gpu(i) for i in range(3)], processes=[proc(42, gpus=[0, 1, 2])]), at(0))
    assert [a.decision for a in out.actions] == ["run", "run", "suppressed"]
    assert "max_per_hour" in (out.actions[2].reason or "")


def test_fleet_wide_limits_per_action_type(tmp_path: Path) -> None:
    cfg = Config.model_validate({"engine": {"limits": {"kill": {"max_per_hour": 1}}}})
    core = Core(rules_from(tmp_path, """\
rules:
  - name: k
    entity: process
    when: process.user == 'bob'
    actions: [{type: kill}]
"""), cfg)
    out = core.step(snapshot(at(0), gpus=[gpu(0)], processes=[proc(1, user="bob"), proc(2, user="bob")]), at(0))
    assert sorted(a.decision for a in out.actions) == ["run", "suppressed"]


def test_protected_processes_are_never_killed(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: k
    entity: process
    when: true
    actions: [{type: kill}, {type: log, message: m}]
"""))
    out = core.step(snapshot(at(0), gpus=[gpu(0)] + [gpu(i, 90) for i in range(1, 8)], processes=[proc(1, user="root")]), at(0))
    assert [(a.type, a.decision) for a in out.actions] == [("kill", "refused"), ("log", "run")]
    assert "protected: user root" in (out.actions[0].reason or "")


def test_dry_run_renders_but_does_not_run(tmp_path: Path) -> None:
    core = idle_core(tmp_path, cfg=config(dry_run=True))
    (req,) = core.step(held_idle(), at(0)).actions
    assert (req.decision, req.dry_run, req.params["to"]) == ("dry_run", True, "alice")


def test_a_missing_owner_does_not_render_as_none(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    (req,) = core.step(snapshot(at(0), gpus=[gpu(0)], processes=[proc(42, user=None)]), at(0)).actions
    assert req.decision == "refused" and req.params["to"] == "" and "to:" in (req.reason or "")


def test_a_reused_pid_is_a_new_process(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: p
    entity: process
    when: process.pid == 42
    actions: [{type: log, message: "{{ process.create_time }}"}]
"""))
    core.step(snapshot(at(0), gpus=[gpu(0)], processes=[proc(42)]), at(0))
    out = core.step(snapshot(at(60), gpus=[gpu(0)], processes=[proc(42, created=at(50))]), at(60))
    assert [(t.entity_id, t.to_status, t.reason) for t in out.transitions] == [
        ("n1/pid42", "resolved", "gone"), ("n1/pid42", "pending", ""), ("n1/pid42", "firing", "")]
    # a create time that wobbles under a second is the same process
    out = core.step(snapshot(at(90), gpus=[gpu(0)], processes=[proc(42, created=at(50.4))]), at(90))
    assert out.transitions == []


def test_process_events_add_and_remove_processes(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    core.step(snapshot(at(0), gpus=[gpu(0)]), at(0))
    out = core.step(make_event("process.started", "n1", proc(7), time=at(5)), at(5))
    assert [t.to_status for t in out.transitions] == ["pending", "firing"]
    assert core.gpus()[0].owners == ["alice"]
    ended = make_event("process.ended", "n1", proc(7), time=at(9))
    assert isinstance(ended, ProcessEvent)
    out = core.step(ended, at(9))
    assert [t.to_status for t in out.transitions] == ["resolved"]


def test_a_gpu_threshold_event_updates_that_gpu(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    core.step(held_idle(util=90), at(0))
    ev = make_event("gpu.idle", "n1", gpu(0, 0, pids=[42]), time=at(30))
    assert isinstance(ev, GpuEvent)
    out = core.step(ev, at(30))
    assert [t.to_status for t in out.transitions] == ["pending", "firing"]
    assert core.gpus()[0].idle_since == at(30) and core.nodes()[0].gpus_idle == 1


def test_an_evaluation_error_counts_as_false_and_is_reported_once(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: tier
    entity: gpu
    when: node.labels.tier == 'gold'
    actions: [{type: log, message: m}]
"""))
    out = core.step(snapshot(at(0), gpus=[gpu(0), gpu(1)]), at(0))
    assert out.transitions == [] and len(out.errors) == 1 and "tier" in out.errors[0].message
    assert core.step(snapshot(at(10), gpus=[gpu(0), gpu(1)]), at(10)).errors == []
    assert sum(core.error_counts.values()) == 4


def test_scheduled_rules_run_only_at_their_cron_instants(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, """\
rules:
  - name: nightly
    entity: node
    when: node.labels.env == 'dev'
    schedule: "0 20 * * *"
    actions: [{type: log, message: m}]
"""), config(tick="1h"), offline_detection=False)
    core.step(snapshot(at(0), labels={"env": "dev"}), at(0))
    assert core.open_incidents() == [] and core.step(Tick(), at(0)).transitions == []
    assert core.step(Tick(), T0 + timedelta(hours=19, minutes=59)).transitions == []
    assert core.next_wakeup(T0 + timedelta(hours=19, minutes=59)) == T0 + timedelta(hours=20)
    out = core.step(Tick(), T0 + timedelta(hours=20))
    assert [t.to_status for t in out.transitions] == ["pending", "firing"]


def test_clusters_other_than_the_engines_prefix_entity_ids(tmp_path: Path) -> None:
    core = idle_core(tmp_path)
    (req,) = core.step(held_idle(cluster="c2"), at(0)).actions
    assert req.entity_id == "c2:n1/gpu0" and req.cluster == "c2"


def test_a_sweep_in_slices_gives_what_one_tick_gives(tmp_path: Path) -> None:
    """The engine sweeps time-dependent rules a slice of entities at a time (`Tick(sweep=False)` names them,
    `Sweep` steps evaluate them); done at the tick's time, that is the same as one full tick."""
    text = """\
rules:
  - name: timed
    entity: gpu
    when: gpu.idle_for_s > 30
    for: 60s
    actions: [{type: log, message: m}]
  - name: untimed
    entity: gpu
    when: gpu.util_pct > 50
    actions: [{type: log, message: m}]
"""
    cfg = Config.model_validate({"agent": {"snapshot_interval": "1h"}})  # online for three hours
    whole, sliced = Core(rules_from(tmp_path, text), cfg), Core(rules_from(tmp_path, text), cfg)
    for core in (whole, sliced):
        for n in range(5):
            core.step(snapshot(at(0), node=f"n{n}", gpus=[gpu(0, 0), gpu(1, 90), gpu(2, 0)]), at(0))

    def seen(t: float) -> list[tuple[str, str, str]]:
        one = whole.step(Tick(), at(t))
        part = sliced.step(Tick(sweep=False), at(t))
        if t == 40:  # the sweep is left to the Sweep steps
            assert part.sweeps == ["timed"] and part.transitions == []
        for name in part.sweeps:
            keys = list(sliced.state.by_kind["gpu"])
            for i in range(0, len(keys), 4):
                part.extend(sliced.step(Sweep(rule=name, keys=tuple(keys[i:i + 4])), at(t)))
        got = sorted((x.rule, x.entity_id, x.to_status) for x in part.transitions)
        assert got == sorted((x.rule, x.entity_id, x.to_status) for x in one.transitions)
        return got

    assert seen(10) == []
    assert seen(40) == sorted(("timed", f"n{n}/gpu{g}", "pending") for n in range(5) for g in (0, 2))
    assert seen(130) == sorted(("timed", f"n{n}/gpu{g}", "firing") for n in range(5) for g in (0, 2))
    assert [i.status for i in sliced.open_incidents()] == [i.status for i in whole.open_incidents()]


def test_a_sweep_slice_of_a_rule_changed_since_is_left_to_its_next_sweep(tmp_path: Path) -> None:
    cfg = Config.model_validate({"agent": {"snapshot_interval": "1h"}})
    core = Core(rules_from(tmp_path, """\
rules:
  - name: timed
    entity: gpu
    when: gpu.idle_for_s > 30
    actions: [{type: log, message: m}]
"""), cfg)
    core.step(snapshot(at(0), gpus=[gpu(0, 0)]), at(0))
    keys = tuple(core.state.by_kind["gpu"])
    rule = core.rules.by_name["timed"]
    assert core.step(Sweep(rule="timed", keys=keys, rule_hash="a-rule-since-replaced"), at(40)).transitions == []
    fired = core.step(Sweep(rule="timed", keys=keys, rule_hash=rule.hash), at(40)).transitions
    assert [(t.entity_id, t.to_status) for t in fired][-1] == ("n1/gpu0", "firing")
