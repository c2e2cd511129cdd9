"""Malformed events from a node cannot mint metric series or flood the log: kinds from a fixed set, a few lines."""

from __future__ import annotations

import logging

import orjson
import pytest

from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.clock import ManualClock
from gpuevents.config import Config
from gpuevents.events import decode_event, encode_event
from rules.engine.deadletter import KINDS, DeadLetters, SubjectMismatch, error_kind
from rules.engine.metrics import EngineMetrics
from rules.engine.service import Engine
from tests.rules.engine.conftest import T0, snapshot
from tests.rules.engine.helpers import incident, publish, running
from tests.waiting import wait_for

MALFORMED = 5000


def malformed(i: int) -> bytes:
    """A snapshot of n1 whose node label `k<i>` is a list: each one fails validation at its own location."""
    raw = orjson.loads(encode_event(snapshot("n1", T0)))
    raw["id"] = f"bad-{i}"
    raw["data"]["node"]["labels"] = {f"k{i}": [i]}
    return orjson.dumps(raw)


def malformed_series(engine: Engine) -> dict[str, float]:
    return {s.labels["kind"]: s.value for m in engine.metrics.malformed.collect() for s in m.samples
            if s.name.endswith("_total")}


@pytest.mark.slow  # five thousand events through a real engine
async def test_five_thousand_distinct_malformed_events_make_one_series_and_one_log_line(
        engine_config: Config, bus: Bus, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rules.engine.deadletter")
    subject = S.event_subject("c1", "n1", "node.snapshot")
    async with running(await Engine.open(engine_config, bus, clock=ManualClock(T0))) as engine:
        for i in range(MALFORMED):
            await bus.js_publish(subject, malformed(i))
        await publish(bus, snapshot("n2", T0))
        await wait_for(lambda: incident(engine, "n2/gpu0"), timeout=120, what="the good event after the bad ones")
        assert malformed_series(engine) == {"invalid": MALFORMED}
        assert engine.dead_letters.seen == {"invalid": MALFORMED}
    lines = [r for r in caplog.records if r.name == "rules.engine.deadletter"]
    assert len(lines) == 1, [r.getMessage()[:120] for r in lines[:5]]
    assert "malformed event (invalid)" in lines[0].getMessage()


def test_each_kind_of_malformed_event_has_a_name_from_the_fixed_set() -> None:
    def kind_of(raw: bytes) -> str:
        try:
            decode_event(raw)
        except Exception as e:
            return error_kind(e)
        raise AssertionError(f"{raw!r} decoded")

    assert kind_of(b"\xff not json") == "invalid_json"
    assert kind_of(b'{"type": "made.up.%d"}' % 7) == "unknown_type"
    assert kind_of(b'{"no": "type"}') == "unknown_type"
    assert kind_of(malformed(3)) == "invalid"
    assert error_kind(SubjectMismatch("n2 posing as n1")) == "spoofed"
    assert error_kind(RuntimeError("a bug")) == "unapplicable"
    assert set(KINDS) == {"invalid_json", "unknown_type", "invalid", "spoofed", "unapplicable"}


async def test_a_steady_stream_of_malformed_events_is_summed_up_once_per_interval(
        bus: Bus, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rules.engine.deadletter")
    await bus.ensure_streams()
    ticks = iter(range(0, 10_000, 7))  # a monotonic clock that advances 7 s per malformed event
    letters = DeadLetters(bus, EngineMetrics(), summary_every=60, monotonic=lambda: float(next(ticks)))
    subject = S.event_subject("c1", "n1", "node.snapshot")
    for i in range(30):  # 30 events over 203 s: the first line, then one summary per 60 s
        try:
            decode_event(malformed(i))
        except ValueError as e:
            await letters.send(subject, malformed(i), e)
    assert letters.seen == {"invalid": 30}
    lines = [r.getMessage() for r in caplog.records if r.name == "rules.engine.deadletter"]
    assert len(lines) == 4, lines
    assert lines[1].startswith("9 more malformed events (invalid)")  # events 2..10: 63 s after the first
    assert "data.node.labels.k9: Input should be a valid string" in lines[1]
    dead = [m async for m in bus.replay(S.STREAM_DLQ, S.DLQ_ALL)]
    assert len(dead) == 30
