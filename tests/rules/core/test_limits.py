"""Limits (DESIGN §3.4): on_resolve goes through them except restores; the rolling hour survives a restart;
the fleet share counts matching entities (pending or firing) in the action's unit, from the first one."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from gpuevents.config import Config
from gpuevents.records import ActionRequest
from rules.core.core import Core, Tick
from tests.rules.helpers import at, gpu, proc, rules_from, snapshot

RESOLVE_KILLS = """\
rules:
  - name: bad-metric
    entity: gpu
    when: gpu.temp_c > 85
    limits: {max_per_hour: 1, max_fleet_pct: 10}
    actions: [{type: log, message: hot}]
    on_resolve:
      - {type: kill}
      - {type: cordon}
      - {type: uncordon}
      - {type: scale, provider: command, argv: [echo, "{replicas}"], replicas: previous}
"""


def ten_hot_gpus(core: Core, t: float, hot: bool = True) -> list[ActionRequest]:
    gpus = [gpu(i, 90, temp_c=90 if hot else 50) for i in range(10)]
    procs = [proc(100 + i, gpus=[i]) for i in range(10)]
    return core.step(snapshot(at(t), gpus=gpus, processes=procs), at(t)).actions


def test_on_resolve_destructive_actions_go_through_the_limits_but_restores_do_not(tmp_path: Path) -> None:
    cfg = Config.model_validate({"engine": {"limits": {"kill": {"max_per_hour": 5}}}})
    core = Core(rules_from(tmp_path, RESOLVE_KILLS), cfg)
    ten_hot_gpus(core, 0)
    resolved = ten_hot_gpus(core, 60, hot=False)  # the bad metric recovers: all ten resolve at once
    kills = [a for a in resolved if a.type == "kill"]
    cordons = [a for a in resolved if a.type == "cordon"]
    assert len(kills) == 10 and len(cordons) == 10
    assert sum(a.decision == "run" for a in kills + cordons) <= 1  # max_per_hour: 1 for the rule
    assert all(a.decision in ("suppressed", "held") for a in kills + cordons if a.decision != "run")
    restores = [a for a in resolved if a.type in ("uncordon", "scale")]
    assert len(restores) == 20 and all(a.decision == "run" for a in restores)  # never limited


def test_a_reload_closing_every_incident_runs_no_burst_of_kills(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, RESOLVE_KILLS))
    ten_hot_gpus(core, 0)
    out = core.replace_rules(rules_from(tmp_path, RESOLVE_KILLS.replace("85", "86"), name="changed.yaml"), at(60))
    kills = [a for a in out.actions if a.type == "kill"]
    assert len(kills) == 10 and sum(a.decision == "run" for a in kills) <= 1


KILL_EVERY_HOT_GPU = """\
rules:
  - name: hot-kill
    entity: gpu
    when: gpu.temp_c > 85
    limits: {max_per_hour: 1}
    actions: [{type: kill}]
"""


def test_the_rolling_hour_survives_a_restart(tmp_path: Path) -> None:
    rules = rules_from(tmp_path, KILL_EVERY_HOT_GPU)
    first = Core(rules)
    out = first.step(snapshot(at(0), gpus=[gpu(0, temp_c=90), gpu(1)], processes=[proc(1, gpus=[0])]), at(0))
    assert [a.decision for a in out.actions] == ["run"]
    assert out.limits is not None  # the step reports the windows it changed, to persist
    restarted = Core(rules)
    restarted.restore(list(first.open_incidents()), now=at(60), limits=out.limits)
    restarted.step(Tick(), at(200))  # the restored fleet is observed before any firing
    later = restarted.step(snapshot(at(300), gpus=[gpu(0, temp_c=90), gpu(1, temp_c=90)],
                                    processes=[proc(1, gpus=[0]), proc(2, gpus=[1])]), at(300))
    assert [a.decision for a in later.actions] == ["suppressed"]  # within the hour of the first kill
    gone = restarted.step(snapshot(at(3701), gpus=[gpu(0), gpu(1)], processes=[]), at(3701))
    again = restarted.step(snapshot(at(3702), gpus=[gpu(0, temp_c=90), gpu(1)], processes=[proc(3, gpus=[0])]),
                           at(3702))
    assert not gone.actions and [a.decision for a in again.actions] == ["run"]


CORDON_IDLE = """\
rules:
  - name: idle-cordon
    entity: gpu
    when: gpu.idle
    {for_}
    limits: {{max_fleet_pct: 50}}
    actions: [{{type: cordon}}]
"""


def test_an_outbreak_on_one_node_is_held_from_its_first_gpu(tmp_path: Path) -> None:
    """5 of 8 GPUs go idle at once under a 50% share of a kill rule: none runs (the share counts the whole
    snapshot's matches, not only those evaluated before)."""
    core = Core(rules_from(tmp_path, """\
rules:
  - name: idle-kill
    entity: gpu
    when: gpu.idle
    limits: {max_fleet_pct: 50}
    actions: [{type: kill}]
"""))
    core.step(snapshot(at(0), gpus=[gpu(i, 90) for i in range(8)]), at(0))
    out = core.step(snapshot(at(30), gpus=[gpu(i, 0 if i < 5 else 90) for i in range(8)]), at(30))
    assert [a.decision for a in out.actions] == ["held"] * 5


def test_pending_entities_count_so_a_for_rule_holds_its_whole_outbreak(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, CORDON_IDLE.format(for_="for: 1m")),
                Config.model_validate({"agent": {"snapshot_interval": "1h"}}))  # no node goes offline
    for n in ("n1", "n2"):
        core.step(snapshot(at(0), node=n, gpus=[gpu(0, 90), gpu(1, 90)]), at(0))
    core.step(snapshot(at(10), node="n1", gpus=[gpu(0, 0), gpu(1, 90)]), at(10))
    core.step(snapshot(at(20), node="n2", gpus=[gpu(0, 0), gpu(1, 90)]), at(20))
    fired = core.step(Tick(), at(90)).actions
    assert [a.decision for a in fired] == ["held", "held"]  # 2 of 2 nodes match: over 50%


def test_a_cordon_share_counts_nodes_even_for_a_gpu_rule(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, CORDON_IDLE.format(for_="")))
    for n in ("n1", "n2"):
        core.step(snapshot(at(0), node=n, gpus=[gpu(i, 90) for i in range(8)]), at(0))
    first = core.step(snapshot(at(10), node="n1", gpus=[gpu(0, 0)] + [gpu(i, 90) for i in range(1, 8)]), at(10))
    second = core.step(snapshot(at(20), node="n2", gpus=[gpu(0, 0)] + [gpu(i, 90) for i in range(1, 8)]), at(20))
    assert [a.decision for a in first.actions] == ["run"]  # 1 of 2 nodes: 50%, not over
    assert [a.decision for a in second.actions] == ["held"]  # 2 of 2 nodes (2 of 16 GPUs would pass)


def test_a_batch_reports_the_windows_once_as_its_steps_would(tmp_path: Path) -> None:
    """`step_batch` takes the windows at the batch's end: the same windows the last of the same steps taken one
    by one reported, and none while nothing changed them; each step's result is in the batch's."""
    rules = rules_from(tmp_path, KILL_EVERY_HOT_GPU.replace("max_per_hour: 1", "max_per_hour: 5"))
    each, batched = Core(rules), Core(rules)
    events = [snapshot(at(i), gpus=[gpu(g, temp_c=90 if g <= i else 50) for g in range(3)],
                       processes=[proc(10 + g, gpus=[g]) for g in range(3)]) for i in range(3)]
    reported = None
    actions = []
    for i, ev in enumerate(events):
        out = each.step(ev, at(i))
        reported = out.limits or reported
        actions += out.actions
    seen: list[datetime] = []
    batch = batched.step_batch(((ev, at(i)) for i, ev in enumerate(events)), after=lambda _e, t: seen.append(t))
    assert reported is not None and len(reported.rules["hot-kill"]) == 3
    assert batch.result.limits == reported and batch.failed == [] and seen == [at(0), at(1), at(2)]
    assert [a.key for a in batch.result.actions] == [a.key for a in actions]
    assert batched.take_limits(at(3)) is None  # taken: nothing changed since


def test_an_input_the_core_cannot_digest_is_left_out_of_the_batch(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, KILL_EVERY_HOT_GPU))
    hot = snapshot(at(0), gpus=[gpu(0, temp_c=90)], processes=[proc(10, gpus=[0])])
    batch = core.step_batch([(object(), at(0)), (hot, at(0))])  # type: ignore[list-item]  # not an input
    assert [i for i, _e in batch.failed] == [0] and len(batch.result.actions) == 1
