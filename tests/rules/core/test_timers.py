"""Timers: ticks promote `for` deadlines and re-evaluate time-dependent conditions, scheduled rules run at their
cron instants, and `next_wakeup` names the soonest. Cron instants missed during a restart or failover are caught
up once, late, within a grace, for the incidents not evaluated at or after that instant (`last_eval_at`, persisted
at every scheduled evaluation)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from gpuevents.config import Config
from rules.core.core import Core, Tick
from rules.core.incidents import Incident, Transition
from rules.lang.loader import load_rule_set
from rules.lang.model import RuleSet
from tests.rules.helpers import T0, at, config, gpu, held_idle, idle_core, rules_from, snapshot

LIBRARY = Path(__file__).resolve().parents[3] / "rules" / "library"
BERLIN = ZoneInfo("Europe/Berlin")
FRIDAY_20 = datetime(2026, 12, 4, 20, 0, tzinfo=BERLIN)
MONDAY_07 = datetime(2026, 12, 7, 7, 0, tzinfo=BERLIN)
LABELS = {"env": "staging", "gpuevents.io/namespace": "ml", "gpuevents.io/deployment": "inference"}


def weekend() -> RuleSet:
    return load_rule_set([LIBRARY / "weekend-scale.yaml"])


def new_core() -> Core:
    """An engine's core: snapshots every 15 s, so the fleet counts as observed 45 s after a restore."""
    return Core(weekend(), config(tick="30s"))


def seen(core: Core, t: datetime) -> None:
    core.step(snapshot(t, node="stg-1", gpus=[gpu(0, 40)], labels=LABELS), t)


def fired_on_friday() -> list[Incident]:
    core = new_core()
    seen(core, FRIDAY_20 - timedelta(seconds=10))
    out = core.step(Tick(), FRIDAY_20)
    assert [(a.type, a.params["replicas"]) for a in out.actions] == [("scale", 0)]
    (inc,) = core.open_incidents()
    assert inc.status == "firing" and inc.last_eval_at == FRIDAY_20
    return core.open_incidents()


def restart(saved: list[Incident], at: datetime) -> Core:
    core = new_core()
    core.restore(saved, now=at)
    return core


def run_until(core: Core, start: datetime, end: datetime) -> list[Transition]:
    """A snapshot and a tick every 15 s from `start` to `end`; all the transitions."""
    out: list[Transition] = []
    t = start
    while t <= end:
        seen(core, t)
        out += core.step(Tick(), t).transitions
        t += timedelta(seconds=15)
    return out


def test_a_monday_instant_missed_by_a_restart_still_resolves_the_weekend_incident() -> None:
    core = restart(fired_on_friday(), MONDAY_07 + timedelta(seconds=40))
    first = MONDAY_07 + timedelta(seconds=40)
    seen(core, first)
    assert core.step(Tick(), first).transitions == []  # the fleet is not observed yet: not decided on half a fleet
    assert core.next_wakeup(first) <= first + timedelta(seconds=45)
    transitions = run_until(core, first, first + timedelta(minutes=2))
    assert [(t.to_status, t.reason) for t in transitions] == [("resolved", "condition")]
    assert transitions[0].time == first + timedelta(seconds=45)
    assert core.open_incidents() == []


def test_the_catch_up_runs_the_on_resolve_actions() -> None:
    core = restart(fired_on_friday(), MONDAY_07 + timedelta(seconds=40))
    t = MONDAY_07 + timedelta(seconds=40)
    actions = []
    while t <= MONDAY_07 + timedelta(minutes=2):
        seen(core, t)
        actions += core.step(Tick(), t).actions
        t += timedelta(seconds=15)
    assert [(a.phase, a.type, a.params["replicas"]) for a in actions] == [("resolve", "scale", "previous")]


def test_an_instant_older_than_the_grace_is_not_caught_up() -> None:
    core = restart(fired_on_friday(), MONDAY_07 + timedelta(minutes=30))
    transitions = run_until(core, MONDAY_07 + timedelta(minutes=30), MONDAY_07 + timedelta(minutes=33))
    assert transitions == [] and [i.status for i in core.open_incidents()] == ["firing"]


def test_an_instant_already_evaluated_before_the_restart_is_not_run_again() -> None:
    saved = fired_on_friday()
    core = restart(saved, FRIDAY_20 + timedelta(seconds=30))
    transitions = run_until(core, FRIDAY_20 + timedelta(seconds=30), FRIDAY_20 + timedelta(minutes=3))
    assert transitions == [] and core.open_incidents() == saved


def test_a_fresh_engine_started_just_after_an_instant_fires_it() -> None:
    start = FRIDAY_20 + timedelta(seconds=50)
    core = restart([], start)
    transitions = run_until(core, start, start + timedelta(minutes=2))
    assert [t.to_status for t in transitions] == ["pending", "firing"]


def test_every_scheduled_evaluation_of_an_open_incident_is_persisted(tmp_path: Path) -> None:
    rule = weekend().rules[0]
    assert rule.last_cron(MONDAY_07 + timedelta(minutes=3)) == MONDAY_07
    assert rule.last_cron(MONDAY_07 - timedelta(seconds=1)) == FRIDAY_20
    core = Core(rules_from(tmp_path, """\
rules:
  - name: hourly
    entity: node
    when: node.labels.env == 'staging'
    schedule: "0 * * * *"
    actions: [{type: log, message: m}]
"""), config(tick="30s"))
    t0 = datetime(2026, 12, 4, 20, 0, tzinfo=BERLIN)
    seen(core, t0)
    assert [t.to_status for t in core.step(Tick(), t0).transitions] == ["pending", "firing"]
    seen(core, t0 + timedelta(minutes=59, seconds=50))
    out = core.step(Tick(), t0 + timedelta(hours=1))  # still true: no transition, but the evaluation is stored
    assert out.transitions == [] and out.actions == []
    assert [(i.status, i.last_eval_at) for i in out.incidents] == [("firing", t0 + timedelta(hours=1))]


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
    assert {(t.rule, t.entity_id, t.to_status) for t in out.transitions if t.to_status == "firing"} == {("timed",
                                                                                                         "n1/gpu0",
                                                                                                         "firing")}


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


def test_the_book_keeps_each_incidents_deadline_and_the_earliest(tmp_path: Path) -> None:
    core = idle_core(tmp_path, "for: 2m\n    repeat: 10m",
                     Config.model_validate({"agent": {"snapshot_interval": "1h"}}))
    core.step(held_idle(), at(0))
    core.step(held_idle(node="n2"), at(60))
    book = core.book
    assert (book.deadline("idle", "n1/gpu0"), book.deadline("idle", "n2/gpu0")) == (at(120), at(180))
    assert book.next_deadline() == at(120) and book.pop_due(at(100)) == []
    core.step(Tick(), at(150))  # n1 fires at 150: its first repeat is due at 750
    assert book.deadline("idle", "n1/gpu0") == at(750) and book.next_deadline() == at(180)
    core.step(Tick(), at(200))  # n2 fires at 200: 800
    assert book.next_deadline() == at(750)
    assert book.pop_due(at(800)) == [("idle", "n1/gpu0"), ("idle", "n2/gpu0")]
    assert book.next_deadline() is None  # taken: evaluated now, each that changes notes its next deadline
