"""The incident state machine, table-driven as Prometheus tests its alerting rules: one evaluation a minute."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from rules.core.incidents import (
    Incident,
    next_deadline,
    open_incident,
    resolve,
    send_phase,
    step,
    transitions,
)

BASE = datetime(2026, 1, 5, tzinfo=UTC)


def minute(i: int) -> datetime:
    return BASE + timedelta(minutes=i)


@dataclass(frozen=True)
class Case:
    name: str
    for_s: float
    repeat_s: float | None
    matched: str  # one char per minute: 1 true, 0 false
    statuses: str  # one char per minute: . inactive, p pending, F firing, r resolved (on that step), i inactive again
    sends: str  # one char per minute: . nothing, f fire, R repeat, x resolve


CASES = [
    Case("no for fires at once", 0, None, "1110", "FFFr", "f..x"),
    Case("for 2m holds pending then fires", 120, None, "11110", "ppFFr", "..f.x"),
    Case("false before for elapses goes back to inactive", 180, None, "1101111", "ppipppF", "......f"),
    Case("repeat every 2m while firing", 0, 120, "111111", "FFFFFF", "f.R.R."),
    Case("repeat with for counts from the firing", 60, 120, "111111", "pFFFFF", ".f.R.R"),
    Case("a new incident after resolution", 0, None, "1011", "FrFF", "fxf."),
    Case("never true never opens", 60, None, "0000", "....", "...."),
]


def run(case: Case) -> tuple[str, str, list[Incident]]:
    inc: Incident | None = None
    statuses, sends, history = "", "", []
    for i, m in enumerate(case.matched):
        now = minute(i)
        matched = m == "1"
        before = inc
        if inc is None:
            if not matched:
                statuses += "."
                sends += "."
                continue
            inc = open_incident("r", "h", "n1/gpu0", "n1/gpu0", "gpu", "default", "n1", now)
            after = step(inc, True, now, case.for_s, case.repeat_s)
            before = None
        else:
            after = step(inc, matched, now, case.for_s, case.repeat_s)
        phase = send_phase(before, after)
        sends += {"fire": "f", "repeat": "R", "resolve": "x", None: "."}[phase]
        statuses += {"pending": "p", "firing": "F", "resolved": "r", "inactive": "i"}[after.status]
        history.append(after)
        inc = after if after.open else None
    return statuses, sends, history


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_incident_state_machine(case: Case) -> None:
    statuses, sends, _ = run(case)
    assert (statuses, sends) == (case.statuses, case.sends)


def test_timestamps_are_kept_as_prometheus_does() -> None:
    _, _, history = run(Case("", 120, 120, "1111110", "", ""))
    firing = [h for h in history if h.status == "firing"]
    assert firing[0].active_at == minute(0)
    assert firing[0].fired_at == minute(2) and firing[0].last_sent_at == minute(2) and firing[0].sends == 1
    assert firing[-1].last_sent_at == minute(4) and firing[-1].sends == 2 and firing[-1].repeat_count == 1
    last = history[-1]
    assert (last.status, last.resolved_at, last.resolve_reason) == ("resolved", minute(6), "condition")
    assert last.firing_for(minute(9)) == "4m"  # fired at 2, resolved at 6


def test_pending_with_for_zero_goes_straight_through_pending_to_firing() -> None:
    inc = open_incident("r", "h", "e", "e", "gpu", "default", "n1", BASE)
    after = step(inc, True, BASE, 0, None)
    assert [(t.from_status, t.to_status) for t in transitions(None, after)] == [("inactive", "pending"),
                                                                                ("pending", "firing")]


def test_resolving_a_pending_incident_makes_it_inactive_without_actions() -> None:
    inc = open_incident("r", "h", "e", "e", "gpu", "default", "n1", BASE)
    gone = resolve(inc, minute(1), "gone")
    assert gone.status == "inactive" and send_phase(inc, gone) is None


def test_incident_ids_are_deterministic_per_rule_entity_and_start() -> None:
    a = open_incident("r", "h", "e", "e", "gpu", "default", "n1", BASE)
    b = open_incident("r", "h", "e", "e", "gpu", "default", "n1", BASE)
    c = open_incident("r", "h", "e", "e", "gpu", "default", "n1", minute(1))
    assert a.id == b.id != c.id


def test_deadlines_are_the_end_of_for_and_the_next_repeat() -> None:
    inc = open_incident("r", "h", "e", "e", "gpu", "default", "n1", BASE)
    assert next_deadline(inc, 120, None) == minute(2)
    fired = step(inc, True, minute(2), 120, 300)
    assert next_deadline(fired, 120, 300) == minute(7)
    assert next_deadline(fired, 120, None) is None


def test_incidents_round_trip_through_json() -> None:
    inc = step(open_incident("r", "h", "e", "e", "gpu", "default", "n1", BASE), True, minute(1), 0, None)
    assert Incident.model_validate_json(inc.model_dump_json()) == inc


def test_active_for_counts_the_pending_time_firing_for_does_not() -> None:
    inc = Incident(id="i", rule="r", entity_id="e", entity_key="e", entity_kind="gpu", status="firing",
                   active_at=minute(0), fired_at=minute(10))
    assert inc.firing_for(minute(10)) == "0s"  # what the first DM said: "idle for 0s"
    assert inc.active_for(minute(10)) == "10m"
