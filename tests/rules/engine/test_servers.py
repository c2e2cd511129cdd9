"""The acting engine's status and snooze servers, asked over a real nats-server as the command line asks."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from nats.js import JetStreamContext

from gpuevents import subjects as S
from gpuevents.bus import Bus, BusNoResponders
from gpuevents.clock import ManualClock
from gpuevents.config import Config
from gpuevents.wire import ErrorReply, KeepReply, KeepRequest, keep_request
from rules.engine.service import Engine
from rules.usage.keeps import KeepStore, KeptGpu
from tests.rules.engine.conftest import IDLE_RULES, T0, snapshot
from tests.rules.engine.helpers import act_requests, audit_records, incident, publish, running
from tests.waiting import wait_for


async def ask(bus: Bus, subject: str, payload: bytes) -> dict[str, Any]:
    reply: dict[str, Any] = orjson.loads(await bus.request(subject, payload, timeout=5))
    return reply


async def test_status_answers_the_fleet_and_its_open_incidents(engine_config: Config, bus: Bus) -> None:
    async with running(await Engine.open(engine_config, bus, clock=ManualClock(T0))) as engine:
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
    async with running(await Engine.open(engine_config, bus, clock=clock)) as engine:
        await publish(bus, snapshot("n1", T0))
        await wait_for(lambda: incident(engine, "n1/gpu0"), what="a pending incident")
        s = KeepRequest(rule="idle-gpu-1h", entity_id="n1/gpu0", until=T0 + timedelta(hours=4), by="alice")
        reply = KeepReply.model_validate(await ask(bus, S.ENGINE_SNOOZE, s.model_dump_json().encode()))
        assert (reply.ok, reply.until, reply.asked_until, reply.capped, reply.snooze_max_s) == (
            True, s.until, s.until, False, 86400.0)
        assert incident(engine, "n1/gpu0") is None
        unknown = s.model_copy(update={"rule": "no-such-rule"})
        assert KeepReply.model_validate(await ask(bus, S.ENGINE_SNOOZE, unknown.model_dump_json().encode())) == \
            KeepReply(ok=False, error="no rule named 'no-such-rule'")
        malformed = await ask(bus, S.ENGINE_SNOOZE, b'{"rule": "idle-gpu-1h"}')
        assert malformed == {"ok": False, "error": "malformed snooze request: entity_id: Field required; "
                                                   "until: Field required; by: Field required"}
    snoozes = [r for r in await audit_records(bus) if r.kind == "snooze"]
    assert [(r.rule, r.entity_id) for r in snoozes] == [("idle-gpu-1h", "n1/gpu0")]


async def test_the_engine_takes_only_the_wire_model_and_says_which_field_is_wrong(engine_config: Config,
                                                                                bus: Bus) -> None:
    """The dict Slack's click used to send (the core's `Snooze` with `type` and `bounded`) is no request: each end
    builds `KeepRequest`, and anything else is refused with the field that is wrong, never applied."""
    until = (T0 + timedelta(hours=4)).isoformat()
    old_click = {"type": "snooze", "rule": "idle-gpu-1h", "entity_id": "n1/gpu0", "by": "slack:U1",
                 "until": until, "reason": "kept from Slack", "bounded": True}
    naive = {"rule": "idle-gpu-1h", "entity_id": "n1/gpu0", "by": "alice", "until": "2026-01-05T13:00:00"}
    no_reason = {"rule": "idle-gpu-1h", "entity_id": "n1/gpu0", "by": "alice", "until": until, "keep": True}
    async with running(await Engine.open(engine_config, bus, clock=ManualClock(T0))) as engine:
        answers = [await ask(bus, S.ENGINE_SNOOZE, orjson.dumps(r)) for r in (old_click, naive, no_reason)]
        assert not engine.core.snoozes
        others = {what: await ask(bus, subject, payload) for subject, what, payload in (
            (S.ENGINE_FREE, "free", b'{"count": 0}'), (S.ENGINE_ACT, "kill or cancel", b'{"type": "kill"}'),
            (S.ENGINE_STATUS, "status", b'{"view": 7}'))}
    assert [a["ok"] for a in answers] == [False, False, False]
    assert "type: Extra inputs are not permitted" in answers[0]["error"]
    assert "bounded: Extra inputs are not permitted" in answers[0]["error"]
    assert "until: Input should have timezone info" in answers[1]["error"]
    assert "a keep needs a reason" in answers[2]["error"]
    for what, bad in others.items():
        assert ErrorReply.model_validate(bad).error.startswith(f"malformed {what} request: "), bad
    assert "count: Input should be greater than or equal to 1" in others["free"]["error"]


def _rules(tmp_dir: Path, approve: bool) -> None:
    kill = "      - type: kill\n        after: 30m\n" + ('        approve: "#gpu-leads"\n' if approve else "")
    (tmp_dir / "idle.yaml").write_text(IDLE_RULES.replace("rules:\n", "rules:\n").rstrip("\n") + "\n" + kill)


async def test_a_keep_longer_than_snooze_max_asks_the_rules_approving_channel(
        engine_config: Config, bus: Bus, rules_dir: Path, jetstream: JetStreamContext) -> None:
    _rules(rules_dir, approve=True)
    async with running(await Engine.open(engine_config, bus, clock=ManualClock(T0))) as engine:
        await publish(bus, snapshot("n1", T0))
        await wait_for(lambda: incident(engine, "n1/gpu0"), what="a pending incident")
        req = keep_request("idle-gpu-1h", "n1/gpu0", 30 * 86400, T0, "alice", "a 30-day training run", keep=True)
        reply = KeepReply.model_validate(await ask(bus, S.ENGINE_SNOOZE, req.model_dump_json().encode()))
        kept = engine.core.snoozes[("idle-gpu-1h", "n1/gpu0")]
    assert reply.ok and reply.until == T0 + timedelta(days=1) == kept.until  # snooze_max meanwhile
    assert reply.approval == "#gpu-leads" and reply.asked_until == req.until
    assert reply.note(30 * 86400) == ("the rule's snooze_max is 1d: kept for 1d meanwhile; the 30d asked for "
                                      "awaits approval in #gpu-leads")
    assert kept.reason == "a 30-day training run" and kept.bounded
    [asked] = [r for r in await act_requests(jetstream) if r.type == "keep"]
    assert (asked.approve, asked.rule, asked.entity_id, asked.decision) == ("#gpu-leads", "idle-gpu-1h",
                                                                            "n1/gpu0", "run")
    assert asked.params["until"] == req.until.isoformat() and asked.params["asked_reason"] == "a 30-day training run"
    assert asked.params["reason"].startswith("alice asks to keep it until 2026-02-04 09:00 UTC (30d; the rule "
                                             "allows 1d)")
    [audited] = [r for r in await audit_records(bus) if r.kind == "snooze"]
    assert audited.detail is not None and audited.detail.endswith(
        f"a 30-day training run; {req.until.isoformat()} awaits approval in #gpu-leads")
    with KeepStore(engine_config.engine.usage_db) as keeps:  # for the weekly report: the GPU, who, why, how long
        [row] = keeps.window(0, 2e9)
    assert (row.cluster, row.entity_id, row.gpus, row.by, row.reason) == (
        "c1", "n1/gpu0", (KeptGpu("n1", 0),), "alice", "a 30-day training run")
    assert (row.start, row.until, row.asked_until) == (T0.timestamp(), kept.until.timestamp(), req.until.timestamp())


async def test_a_keep_longer_than_snooze_max_without_an_approver_says_who_to_ask(
        engine_config: Config, bus: Bus, rules_dir: Path, jetstream: JetStreamContext) -> None:
    _rules(rules_dir, approve=False)
    config = engine_config.model_copy(update={"actions": engine_config.actions.model_copy(update={
        "slack": engine_config.actions.slack.model_copy(update={"admins": ["U003"]})})})
    async with running(await Engine.open(config, bus, clock=ManualClock(T0))):
        req = keep_request("idle-gpu-1h", "n1/gpu0", 30 * 86400, T0, "alice", "a long run", keep=True)
        reply = KeepReply.model_validate(await ask(bus, S.ENGINE_SNOOZE, req.model_dump_json().encode()))
    assert reply.ok and reply.until == T0 + timedelta(days=1) and reply.approval is None
    assert reply.note(30 * 86400, lambda u: f"<@{u}>") == (
        "this rule allows at most 1d and names no approving channel: kept for 1d; for 30d ask <@U003>")
    assert (await jetstream.stream_info(S.STREAM_ACTIONS)).state.messages == 0  # nothing asked of anyone


async def test_an_engine_that_stopped_acting_answers_no_more(engine_config: Config, bus: Bus) -> None:
    async with running(await Engine.open(engine_config, bus, clock=ManualClock(T0))):
        assert "summary" in await ask(bus, S.ENGINE_STATUS, b"{}")
    with pytest.raises(BusNoResponders):
        await bus.request(S.ENGINE_STATUS, b"{}", timeout=5)
