"""The incident book: one live deadline per open incident, kept as it changes; due ones are found without a scan."""

from __future__ import annotations

from pathlib import Path

from rules.core.book import IncidentBook
from rules.core.incidents import open_incident, resolve, step
from rules.core.inputs import Snooze
from tests.rules.helpers import at, rules_from

RULES = """\
rules:
  - name: slow
    entity: gpu
    when: gpu.idle
    for: 2m
    repeat: 10m
    actions: [{type: log, message: m}]
  - name: quick
    entity: gpu
    when: gpu.idle
    actions: [{type: log, message: m}]
"""


def test_each_incident_has_one_live_deadline_and_the_earliest_is_known(tmp_path: Path) -> None:
    rules = rules_from(tmp_path, RULES)
    slow, quick = rules.by_name["slow"], rules.by_name["quick"]
    book = IncidentBook()
    for r in rules:
        book.add_rule(r.name)
    a = open_incident("slow", slow.hash, "n1/gpu0", "n1/gpu0", "gpu", "default", "n1", at(0))
    b = open_incident("slow", slow.hash, "n1/gpu1", "n1/gpu1", "gpu", "default", "n1", at(30))
    book.put(slow, a)
    book.put(slow, b)
    book.put(quick, step(open_incident("quick", quick.hash, "n1/gpu0", "n1/gpu0", "gpu", "default", "n1", at(0)),
                         True, at(0), 0, None))  # firing, no repeat: no deadline
    assert book.next_deadline() == at(120) and sorted(book.rules_on("n1/gpu0")) == ["quick", "slow"]
    fired = step(a, True, at(125), slow.for_s, slow.repeat_s)
    book.put(slow, fired)  # a new deadline replaces the old one (its heap entry goes stale)
    assert book.deadline("slow", "n1/gpu0") == at(725) and book.next_deadline() == at(150)
    book.put(slow, resolve(b, at(140), "condition"))  # closed: no deadline, not indexed
    assert book.get("slow", "n1/gpu1") is None and not book.has_any("n1/gpu1")
    assert book.next_deadline() == at(725)
    assert book.pop_due(at(724)) == [] and book.pop_due(at(725)) == [("slow", "n1/gpu0")]
    assert book.next_deadline() is None and len(book) == 2
    assert book.deadline("slow", "n1/gpu0") == at(725)  # still due (for its node's next event), off the heap


def test_the_heap_stays_bounded_when_deadlines_move_often(tmp_path: Path) -> None:
    rules = rules_from(tmp_path, RULES)
    slow = rules.by_name["slow"]
    book = IncidentBook()
    book.add_rule("slow")
    inc = step(open_incident("slow", slow.hash, "n1/gpu0", "n1/gpu0", "gpu", "default", "n1", at(0)),
               True, at(120), slow.for_s, slow.repeat_s)
    for i in range(1, 1000):  # a repeat every 10 minutes, for a week
        inc = step(inc, True, at(120 + 600 * i), slow.for_s, slow.repeat_s)
        book.put(slow, inc)
    assert len(book._heap) <= 64 + 2 and book.next_deadline() == at(120 + 600 * 1000)


def test_snoozes_end_and_are_lifted_once() -> None:
    book = IncidentBook()
    book.set_snooze(Snooze(rule="slow", entity_id="n1/gpu0", until=at(60)))
    book.set_snooze(Snooze(rule="slow", entity_id="n1/gpu1", until=at(600)))
    assert book.next_snooze_end() == at(60) and book.snooze("slow", "n1/gpu1") is not None
    assert [s.entity_id for s in book.snoozes_ended(at(60))] == ["n1/gpu0"]
    assert book.snoozes_ended(at(60)) == [] and book.next_snooze_end() == at(600)


def test_many_deadlines_due_at_once_come_out_in_deadline_rule_and_key_order(tmp_path: Path) -> None:
    """A fleet's `for` deadlines fall together: past the first few they are taken out in one pass, in the very
    order one-by-one pops give (deadline, then rule, then entity key), stale and later ones left alone."""
    rules = rules_from(tmp_path, RULES)
    slow = rules.by_name["slow"]
    book = IncidentBook()
    book.add_rule("slow")
    keys = [f"n{n}/gpu{g}" for n in range(40) for g in range(8)]
    for i, key in enumerate(reversed(keys)):
        book.put(slow, open_incident("slow", slow.hash, key, key, "gpu", "default", key.split("/")[0],
                                     at(i % 3)))  # due at 120, 121 or 122
    moved = open_incident("slow", slow.hash, keys[0], keys[0], "gpu", "default", "n0", at(50))
    book.put(slow, moved)  # its earlier heap entry is stale: due at 170 now
    expected = sorted((book.deadline("slow", k), "slow", k) for k in keys if k != keys[0])
    due = book.pop_due(at(122))
    assert due == [(r, k) for _, r, k in expected] and len(due) == len(keys) - 1
    assert book.next_deadline() == at(170) and book.pop_due(at(170)) == [("slow", keys[0])]
