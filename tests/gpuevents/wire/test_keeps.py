"""The engine's requests are one model for both ends: what `gpuevents keep` and Slack's Keep form send is the same
`KeepRequest`, captured on a real nats-server; and a reply a failing handler gives still reads as an answer."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from actions.slack_clicks import ClickHandler, SentMessage, remember
from actions.slack_format import KEEP_PREFIX
from actions.slack_keep import keep_view
from actions.store import MemoryKv
from gpuevents import subjects as S
from gpuevents.bus import Bus, Message
from gpuevents.cli import app
from gpuevents.clock import ManualClock
from gpuevents.config import Config, NatsConfig
from gpuevents.records import ActionRequest
from gpuevents.wire import KeepReply, KeepRequest

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


async def _nothing(*_: Any) -> None:
    return None


def _sent() -> SentMessage:
    req = ActionRequest(key="inc1:fire:0:0", type="slack", params={}, rule="idle-held", entity_id="n1/gpu0",
                        entity_kind="gpu", incident_id="inc1", created_at=T0)
    buttons = {"type": "actions", "elements": [{"type": "button", "action_id": f"{KEEP_PREFIX}{8 * 3600}"}]}
    return SentMessage(request=req, channel="DU001", ts="1.000", recipient="U001", blocks=[buttons])


async def test_the_command_line_and_slacks_keep_form_send_the_same_request(
        nats_config: NatsConfig, bus: Bus, tmp_path: Path) -> None:
    asked: list[bytes] = []

    async def engine(msg: Message) -> bytes:
        asked.append(msg.data)
        req = KeepRequest.model_validate_json(msg.data)
        return KeepReply(ok=True, until=req.until, asked_until=req.until, snooze_max_s=86400).model_dump_json().encode()

    await bus.serve(S.ENGINE_SNOOZE, engine)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(Config.model_validate({"nats": nats_config.model_dump()}).model_dump(
        mode="json", include={"nats"})))
    result = await asyncio.to_thread(CliRunner().invoke, app, ["keep", "idle-held", "n1/gpu0", "8h", "--reason",
                                                               " the eval runs tonight ", "-c", str(cfg)])
    assert result.exit_code == 0, result.output

    kv = MemoryKv()
    sent = _sent()
    await remember(kv, sent)
    said: list[str] = []

    async def update(channel: str, ts: str, text: str, blocks: Any) -> None:
        said.append(text)

    handler = ClickHandler(Config(), bus, kv, ManualClock(T0), post=_nothing, update=update, ephemeral=_nothing)
    form = keep_view(sent.request.key, 8 * 3600, [8 * 3600], "keep")
    values = {"reason": {"reason": {"value": "the eval runs tonight"}},
              "for": {"for": {"selected_option": {"value": str(8 * 3600)}}}}
    done = await handler.handle({"type": "view_submission", "user": {"id": "U001"},
                                 "view": {**form, "id": "V1", "state": {"values": values}}})
    assert done.done, done.message

    cli, click = (KeepRequest.model_validate_json(p) for p in asked)  # each parses as the one model
    assert cli.model_dump(exclude={"by", "until"}) == click.model_dump(exclude={"by", "until"}) == {
        "rule": "idle-held", "entity_id": "n1/gpu0", "reason": "the eval runs tonight", "keep": True, "approved_by": ""}
    assert click.until - T0 == timedelta(hours=8) and click.by == "slack:U001"
    assert abs((cli.until - datetime.now(UTC)) - timedelta(hours=8)) < timedelta(minutes=5)
    assert said == [f"kept until {click.until:%Y-%m-%d %H:%M} UTC by <@U001>"]


async def test_with_no_engine_the_form_and_the_command_line_say_the_same_and_store_nothing(
        nats_config: NatsConfig, bus: Bus, tmp_path: Path) -> None:
    await bus.ensure_streams()
    kv = MemoryKv()
    sent = _sent()
    await remember(kv, sent)
    said: list[str] = []

    async def update(channel: str, ts: str, text: str, blocks: Any) -> None:
        said.append(text)

    handler = ClickHandler(Config(), bus, kv, ManualClock(T0), post=_nothing, update=update, ephemeral=_nothing)
    form = keep_view(sent.request.key, 8 * 3600, [8 * 3600], "keep")
    values = {"reason": {"reason": {"value": "eval"}}, "for": {"for": {"selected_option": {"value": "28800"}}}}
    await handler.handle({"type": "view_submission", "user": {"id": "U001"},
                          "view": {**form, "id": "V1", "state": {"values": values}}})
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(Config.model_validate({"nats": nats_config.model_dump()}).model_dump(
        mode="json", include={"nats"})))
    result = await asyncio.to_thread(CliRunner().invoke, app, ["keep", "idle-held", "n1/gpu0", "8h", "--reason",
                                                               "eval", "-c", str(cfg)])
    assert result.exit_code == 1
    [slack] = said
    common = "no engine answered (nobody answers on gpuevents.engine.snooze): n1/gpu0 was not kept. Nothing was stored"
    assert slack.startswith(f"not kept: {common}")
    assert common in " ".join(result.output.split())
    assert await (await bus.kv()).keys("snooze.") == []


def test_a_reply_from_a_handler_that_raised_is_a_refusal_not_a_crash() -> None:
    reply = KeepReply.model_validate_json(b'{"error": "RuntimeError: boom"}')  # what gpuevents/bus answers then
    assert (reply.ok, reply.error, reply.capped, reply.note(3600)) == (False, "RuntimeError: boom", False, "")
