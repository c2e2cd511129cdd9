"""The acting engine's status and snooze servers, asked over a real nats-server as the command line asks."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import orjson
import pytest

from gpuevents import subjects as S
from gpuevents.bus import Bus, BusNoResponders
from gpuevents.clock import ManualClock
from gpuevents.config import Config
from rules.core.core import Snooze
from rules.engine.service import Engine
from tests.rules.engine.conftest import T0, snapshot
from tests.rules.engine.helpers import audit_records, incident, publish, running
from tests.waiting import wait_for


async def ask(bus: Bus, subject: str, payload: bytes) -> dict[str, Any]:
    reply: dict[str, Any] = orjson.loads(await bus.request(subject, payload, timeout=5))
    return reply


async def test_status_answers_the_fleet_and_its_open_incidents(engine_config: Config, bus: Bus) -> None:
    async with running(Engine(engine_config, bus, clock=ManualClock(T0))) as engine:
        await publish(bus, snapshot("n1", T0))
        await wait_for(lambda: incident(engine, "n1/gpu0"), what="a pending incident")
        status = await ask(bus, S.ENGINE_STATUS, b"{}")
        node = await ask(bus, S.ENGINE_STATUS, b'{"view": "node", "node": "n1"}')
    assert (status["summary"]["gpus"], status["summary"]["incidents_pending"]) == (1, 1)
    assert status["incidents"] == []  # the summary lists firing incidents; this one is pending
    assert [n["name"] for n in node["nodes"]] == ["n1"]
    assert [(i["rule"], i["entity_id"], i["status"]) for i in node["incidents"]] == [
        ("idle-gpu-1h", "n1/gpu0", "pending")]


async def test_a_snooze_is_applied_and_audited_and_a_bad_one_is_answered_with_why(engine_config: Config,
                                                                                 bus: Bus) -> None:
    clock = ManualClock(T0)
    async with running(Engine(engine_config, bus, clock=clock)) as engine:
        await publish(bus, snapshot("n1", T0))
        await wait_for(lambda: incident(engine, "n1/gpu0"), what="a pending incident")
        s = Snooze(rule="idle-gpu-1h", entity_id="n1/gpu0", until=T0 + timedelta(hours=4), by="alice")
        assert await ask(bus, S.ENGINE_SNOOZE, s.model_dump_json().encode()) == {
            "ok": True, "until": s.until.isoformat(), "asked_until": s.until.isoformat(), "capped": False,
            "snooze_max_s": 86400.0}
        assert incident(engine, "n1/gpu0") is None
        unknown = s.model_copy(update={"rule": "no-such-rule"})
        assert await ask(bus, S.ENGINE_SNOOZE, unknown.model_dump_json().encode()) == {
            "ok": False, "error": "no rule named 'no-such-rule'"}
        malformed = await ask(bus, S.ENGINE_SNOOZE, b'{"rule": "idle-gpu-1h"}')
        assert malformed["ok"] is False and "entity_id" in malformed["error"]
    snoozes = [r for r in await audit_records(bus) if r.kind == "snooze"]
    assert [(r.rule, r.entity_id) for r in snoozes] == [("idle-gpu-1h", "n1/gpu0")]


async def test_an_engine_that_stopped_acting_answers_no_more(engine_config: Config, bus: Bus) -> None:
    async with running(Engine(engine_config, bus, clock=ManualClock(T0))):
        assert "summary" in await ask(bus, S.ENGINE_STATUS, b"{}")
    with pytest.raises(BusNoResponders):
        await bus.request(S.ENGINE_STATUS, b"{}", timeout=5)
