"""Unreadable KV values: read as absent, counted by the key's kind, logged once per key with what repairs it."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest
from pydantic import BaseModel

from gpuevents.kvstate import UNREADABLE, UnreadableValues, kind_of, parse_or_none


@dataclass
class Entry:
    key: str
    value: bytes


class Record(BaseModel):
    holder: str


@pytest.mark.parametrize(("key", "kind"), [
    ("lease.engine", "lease"), ("lease.engine.p3", "lease"), ("actions.ledger.abc", "ledger"),
    ("incident.idle.n1/gpu0", "incident"), ("snooze.n1", "snooze"), ("a.b.c.ledger", "other"), ("misc", "other"),
])
def test_a_key_is_counted_under_its_kind_from_its_first_three_parts(key: str, kind: str) -> None:
    assert kind_of(key) == kind


def test_a_readable_value_is_parsed_and_not_counted() -> None:
    before = UNREADABLE.counts["lease"]
    assert parse_or_none(Record, Entry("lease.engine", b'{"holder": "a"}')) == Record(holder="a")
    assert UNREADABLE.counts["lease"] == before


def test_an_unreadable_value_is_absent_counted_each_time_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    before = UNREADABLE.counts["snooze"]
    caplog.set_level(logging.ERROR, logger="gpuevents.kv")
    for value in (b"{half", b'{"holder": 3}'):
        assert parse_or_none(Record, Entry("snooze.test-kvstate", value), "the next snooze writes it") is None
    assert UNREADABLE.counts["snooze"] == before + 2
    lines = [r.getMessage() for r in caplog.records if "snooze.test-kvstate" in r.getMessage()]
    assert len(lines) == 1
    assert "read as absent; the next snooze writes it" in lines[0]


def test_the_logged_keys_are_bounded(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr("gpuevents.kvstate._LOGGED_KEYS_MAX", 3)
    seen = UnreadableValues()
    for key in ("other.1", "other.2", "other.3", "other.4", "other.1"):
        seen.saw(key, ValueError("bad"), "x")
    assert seen.counts["other"] == 5
    assert len(seen._logged) <= 3
    assert caplog.text.count("unreadable value at other.1 ") == 2  # forgotten once the set was full: said again
