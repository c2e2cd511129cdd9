"""The owner's conversation end to end: a rule's DM with buttons through the real slack-sdk, clicks over the real
Socket Mode client (and the signed HTTP endpoint) from a local Slack, the engine keeping, the agent releasing.

Engine, runner and Socket Mode client run on a real nats-server; Slack is tests/actions/fakes.FakeSlack (Web API
methods and the Socket Mode websocket); release ends a real child process through the agent's kill handler."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import psutil
import pytest
from aiohttp.test_utils import TestServer

from actions import slack_transport
from actions.runner import ActionRunner
from actions.slack_clicks import SentMessage, sent_key
from actions.slack_format import KEEP_PREFIX, RELEASE
from gpuevents.bus import Bus
from gpuevents.clock import SystemClock
from gpuevents.config import Config, NatsConfig
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, make_event
from rules.engine.service import Engine
from rules.usage.keeps import KeepStore
from tests.actions.builtin.test_kill import Children, children, control, gone, on_gpu  # noqa: F401 - fixtures
from tests.actions.conftest import audit_records, make_request, publish_request
from tests.actions.fakes import FakeSlack
from tests.rules.engine.helpers import running
from tests.waiting import wait_for

RULES = """\
rules:
  - name: idle-held
    entity: gpu
    when: gpu.idle and gpu.processes and gpu.idle_for_s > 3600
    actions:
      - type: slack
        to: "{{ gpu.owner }}"
        text: "GPU {{ gpu.index }} idle: ended in {{ incident.next.in }} unless kept"
        buttons: {keep: [4h, 8h, 3d], release: true, not_mine: true}
      - type: kill
        after: 30m
"""


@pytest.fixture
def config(nats_config: NatsConfig, tmp_path: Path, slack: FakeSlack, monkeypatch: pytest.MonkeyPatch) -> Config:
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test")
    monkeypatch.setenv("SLACK_APP_TOKEN", "xapp-test")
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "idle.yaml").write_text(RULES)
    return Config.model_validate({
        "nats": nats_config.model_dump(),
        "engine": {"rules": [str(tmp_path / "rules")], "tick": "30s", "usage_db": str(tmp_path / "usage.sqlite")},
        "agent": {"snapshot_interval": "1h"},
        "owners": {"alice": "alice@example.com"},
        "protect": {"users": []},
        "actions": {"slack": {"base_url": slack.base_url, "admins": ["U003"], "escalation_channel": "#gpu-admins"},
                    "retry": {"max_attempts": 2, "backoff": 0.1}},
    })


def idle_node(pid: int, created: datetime) -> Any:
    now = datetime.now(UTC)
    gpu = GpuInfo(node="n1", index=0, uuid="GPU-n1-0", model="NVIDIA H100", util_pct=0, idle=True,
                  idle_since=now - timedelta(hours=2), pids=[pid])
    proc = ProcessInfo(node="n1", pid=pid, name="train", user="alice", create_time=created, gpus=[0])
    return make_event("node.snapshot", "n1", NodeSnapshot(node=NodeInfo(name="n1", gpu_count=1), gpus=[gpu],
                                                          processes=[proc]), time=now)


@contextlib.asynccontextmanager
async def runner_and_socket(config: Config, bus: Bus) -> AsyncIterator[None]:
    stop = asyncio.Event()
    kv = await bus.kv()
    tasks = [asyncio.create_task((await ActionRunner.open(bus, config)).run(stop)),
             asyncio.create_task(slack_transport.run_socket_mode(config, bus, kv, SystemClock(), stop))]
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)


@contextlib.asynccontextmanager
async def conversation(config: Config, bus: Bus) -> AsyncIterator[Engine]:
    """The engine, one action runner and the Socket Mode client, as `gpuevents up` runs them."""
    async with runner_and_socket(config, bus), running(await Engine.open(config, bus, clock=SystemClock())) as engine:
        yield engine


def click(action_id: str, sent: SentMessage, user: str, slack: FakeSlack, ts: str = "1.1") -> dict[str, Any]:
    return {"type": "block_actions", "user": {"id": user}, "response_url": slack.response_url(user),
            "trigger_id": f"trigger-{ts}",
            "channel": {"id": sent.channel}, "container": {"message_ts": sent.ts},
            "actions": [{"action_id": action_id, "value": sent.request.key, "action_ts": ts}]}


async def dm_with_buttons(bus: Bus, slack: FakeSlack) -> SentMessage:
    await wait_for(lambda: slack.dms_to("U001"), timeout=20, what="the DM")
    kv = await bus.kv()
    dm = slack.dms_to("U001")[0]
    buttons = next(b for b in dm["blocks"] if b["type"] == "actions")["elements"]
    assert [b["text"]["text"] for b in buttons] == ["Keep 4h", "Keep 8h", "Keep 3d", "Release now", "Not mine"]
    assert "ended in 30m unless kept" in dm["text"]
    key = buttons[0]["value"]
    got = await wait_for(lambda: kv.get(sent_key(key)), what="the message remembered")
    return SentMessage.model_validate_json(got.value)


def form_values(reason: str, seconds: float) -> dict[str, dict[str, Any]]:
    """The Keep form's state as Slack sends it on submission."""
    return {"reason": {"reason": {"type": "plain_text_input", "value": reason}},
            "for": {"for": {"type": "static_select", "selected_option": {"value": str(int(seconds))}}}}


async def keep_through_the_form(slack: FakeSlack, sent: SentMessage, seconds: float, reason: str,
                                envelope: str) -> dict[str, Any]:
    """The owner clicks Keep, the form opens; they submit it with `reason`. The opened form."""
    opened = len(slack.views)
    await slack.send_interactive(f"{envelope}-click", click(f"{KEEP_PREFIX}{int(seconds)}", sent, "U001", slack,
                                                            ts=envelope))
    await wait_for(lambda: len(slack.views) > opened, what="the Keep form opened")
    form = slack.views[-1]
    await slack.send_interactive(envelope, slack.submission(form, "U001", form_values(reason, seconds)))
    return form


async def test_keep_asks_why_in_a_form_then_keeps_within_snooze_max_and_the_staged_kill_never_runs(
        config: Config, bus: Bus, slack: FakeSlack, children: Children) -> None:  # noqa: F811
    proc = await children.start(sys.executable, "-c", "import time; time.sleep(60)")
    created = datetime.fromtimestamp(psutil.Process(proc.pid).create_time(), UTC)
    async with conversation(config, bus) as engine:
        await wait_for(lambda: len(slack.sockets) == 1, timeout=20, what="the Socket Mode connection")
        bus.publish_event(idle_node(proc.pid, created))
        sent = await dm_with_buttons(bus, slack)

        await slack.send_interactive("env-stranger", click(f"{KEEP_PREFIX}14400", sent, "U002", slack))
        await wait_for(lambda: slack.responses, what="the stranger's refusal")
        assert "Only <@U001>" in slack.responses[0]["text"] and not slack.views  # no form for a stranger

        await slack.send_interactive("env-keep-click", click(f"{KEEP_PREFIX}{3 * 86400}", sent, "U001", slack))
        await wait_for(lambda: slack.views, what="the Keep form opened")
        [form] = slack.views
        assert form["trigger_id"] == "trigger-1.1" and form["view"]["type"] == "modal"
        inputs = {b["block_id"]: b["element"] for b in form["view"]["blocks"] if b["type"] == "input"}
        assert inputs["reason"]["type"] == "plain_text_input"
        assert [o["text"]["text"] for o in inputs["for"]["options"]] == ["Keep 4h", "Keep 8h", "Keep 3d"]
        assert inputs["for"]["initial_option"]["value"] == str(3 * 86400)  # the button clicked
        assert not engine.core.snoozes  # nothing kept before the form is sent

        stranger = slack.submission(form, "U002", form_values("mine now", 14400))
        await slack.send_interactive("env-stranger-form", stranger)
        submitted = slack.submission(form, "U001", form_values("the eval finishes tonight", 3 * 86400))
        await slack.send_interactive("env-keep", submitted)
        await slack.send_interactive("env-keep", submitted)  # Slack retrying the envelope: one keep
        await wait_for(lambda: slack.updated, what="the message updated")
        await wait_for(lambda: slack.acks.count("env-keep") == 2, what="both acks")
        snooze = engine.core.snoozes[("idle-held", "n1/gpu0")]
        assert (snooze.until - datetime.now(UTC)).total_seconds() <= 86400  # the rule's snooze_max: 24h
        assert (snooze.reason, snooze.by) == ("the eval finishes tonight", "slack:U001")
        assert not engine.core.open_incidents()  # kept: the incident closed, its staged kill will not run
        [update] = slack.updated
        assert update["ts"] == sent.ts and "kept until" in update["text"] and "<@U001>" in update["text"]
        assert ("this rule allows at most 1d and names no approving channel: kept for 1d; for 3d ask <@U003>"
                in update["text"])
        assert not [b for b in update["blocks"] if b["type"] == "actions"]  # the buttons are gone
    assert proc.returncode is None and psutil.pid_exists(proc.pid)
    records = await audit_records(bus)
    assert [r.detail for r in records if r.kind == "snooze"] == [
        f"kept until {snooze.until.isoformat()} by slack:U001: the eval finishes tonight"]
    clicks = [r.detail or "" for r in records if r.kind == "click"]
    assert sum("keep refused: clicked by U002" in c for c in clicks) == 1  # the stranger's form
    assert sum(c.startswith("keep by U001 (the eval finishes tonight)") for c in clicks) == 1


async def test_a_keep_past_snooze_max_waits_for_the_rules_approving_channel(
        config: Config, bus: Bus, slack: FakeSlack, children: Children, tmp_path: Path) -> None:  # noqa: F811
    (tmp_path / "rules" / "idle.yaml").write_text(RULES + '        approve: "#gpu-leads"\n')
    slack.channel_members["#gpu-leads"] = ["U002"]
    proc = await children.start(sys.executable, "-c", "import time; time.sleep(60)")
    created = datetime.fromtimestamp(psutil.Process(proc.pid).create_time(), UTC)
    async with conversation(config, bus) as engine:
        await wait_for(lambda: len(slack.sockets) == 1, timeout=20, what="the Socket Mode connection")
        bus.publish_event(idle_node(proc.pid, created))
        sent = await dm_with_buttons(bus, slack)
        await keep_through_the_form(slack, sent, 3 * 86400, "a 3-day fine-tune", "k1")
        await wait_for(lambda: slack.updated, what="the owner told")
        first = engine.core.snoozes[("idle-held", "n1/gpu0")]
        assert (first.until - datetime.now(UTC)).total_seconds() <= 86400  # snooze_max meanwhile
        assert "kept for 1d meanwhile; the 3d asked for awaits approval in #gpu-leads" in slack.updated[0]["text"]
        post = await wait_for(lambda: [p for p in slack.posted if p["channel"] == "#gpu-leads"],
                              what="the approval asked")
        assert "Approve `keep` on n1/gpu0 (rule `idle-held`)?" in post[0]["text"]
        assert "slack:U001 asks to keep it until" in post[0]["text"] and "a 3-day fine-tune" in post[0]["text"]
        await slack.send_interactive("approve", answer(post[0], True, "U002", slack))
        def kept_for_days() -> bool:
            until = engine.core.snoozes[("idle-held", "n1/gpu0")].until
            return (until - datetime.now(UTC)).total_seconds() > 2 * 86400

        await wait_for(kept_for_days, timeout=30, what="the full keep once approved")
        full = engine.core.snoozes[("idle-held", "n1/gpu0")]
        assert full.by == "slack:U001, approved by U002 in #gpu-leads" and full.reason == "a 3-day fine-tune"
        told = [p["text"] for p in slack.posted if p["channel"] == "U001"]
        assert len(told) == 1 and "Your keep of n1/gpu0 (rule `idle-held`) until" in told[0]
        assert "was approved by <@U002>" in told[0]
    keeps = [r for r in await audit_records(bus) if r.kind == "action" and r.action_type == "keep"]
    assert [r.outcome for r in keeps] == ["ok"]
    with KeepStore(config.engine.usage_db) as stored:  # one keep for the report, extended by the approval
        [row] = stored.window(0, 2e9)
    assert (row.reason, row.approved_by, row.until) == ("a 3-day fine-tune", "U002 in #gpu-leads",
                                                        full.until.timestamp())
    assert proc.returncode is None


async def test_a_denied_long_keep_stays_at_snooze_max(
        config: Config, bus: Bus, slack: FakeSlack, children: Children, tmp_path: Path) -> None:  # noqa: F811
    (tmp_path / "rules" / "idle.yaml").write_text(RULES + '        approve: "#gpu-leads"\n')
    proc = await children.start(sys.executable, "-c", "import time; time.sleep(60)")
    created = datetime.fromtimestamp(psutil.Process(proc.pid).create_time(), UTC)
    async with conversation(config, bus) as engine:
        await wait_for(lambda: len(slack.sockets) == 1, timeout=20, what="the Socket Mode connection")
        bus.publish_event(idle_node(proc.pid, created))
        sent = await dm_with_buttons(bus, slack)
        await keep_through_the_form(slack, sent, 3 * 86400, "please", "k2")
        post = await wait_for(lambda: [p for p in slack.posted if p["channel"] == "#gpu-leads"],
                              what="the approval asked")
        first = engine.core.snoozes[("idle-held", "n1/gpu0")]
        await slack.send_interactive("deny", answer(post[0], False, "U003", slack))  # an admin denies

        async def decided() -> list[str | None]:
            return [r.outcome for r in await audit_records(bus) if r.kind == "action" and r.action_type == "keep"]

        await wait_for(decided, timeout=30, what="the keep's request decided")
        assert await decided() == ["refused"]
        assert engine.core.snoozes[("idle-held", "n1/gpu0")] == first  # still snooze_max, as it was
        told = [p["text"] for p in slack.posted if p["channel"] == "U001"]
        assert len(told) == 1 and told[0].endswith("was denied by <@U003>: it stays kept for the rule's snooze_max.")
        assert (first.until - datetime.now(UTC)).total_seconds() <= 86400


async def test_release_ends_the_real_process_through_the_agent(
        config: Config, bus: Bus, slack: FakeSlack, children: Children, on_gpu: set[int]) -> None:  # noqa: F811
    proc = await children.start(sys.executable, "-c", "import time; time.sleep(60)")
    on_gpu.add(proc.pid)
    created = datetime.fromtimestamp(psutil.Process(proc.pid).create_time(), UTC)
    async with conversation(config, bus):
        await wait_for(lambda: len(slack.sockets) == 1, timeout=20, what="the Socket Mode connection")
        bus.publish_event(idle_node(proc.pid, created))
        sent = await dm_with_buttons(bus, slack)
        await slack.send_interactive("env-release", click(RELEASE, sent, "U001", slack))
        await wait_for(lambda: gone(proc), timeout=30, what="the released process to end")
        await wait_for(lambda: slack.updated, what="the message updated")
        assert f"released by <@U001>: ending pid {proc.pid}" in slack.updated[0]["text"]


def signed(secret: str, body: bytes, ts: int) -> dict[str, str]:
    base = f"v0:{ts}:".encode() + body
    sig = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": str(ts), "X-Slack-Signature": sig,
            "Content-Type": "application/x-www-form-urlencoded"}


async def test_the_http_endpoint_checks_slacks_signature(config: Config, bus: Bus, slack: FakeSlack) -> None:
    seen: list[dict[str, Any]] = []

    class Recorder:
        async def handle(self, payload: dict[str, Any]) -> Any:
            seen.append(payload)
            return type("R", (), {"message": "recorded"})()

    app = slack_transport.interactivity_app(config, Recorder(), "s3cret", SystemClock())  # type: ignore[arg-type]  # a recording stand-in for ClickHandler
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        body = urlencode({"payload": json.dumps({"type": "block_actions", "actions": []})}).encode()
        url = str(server.make_url(slack_transport.INTERACTIVITY_PATH))
        async with aiohttp.ClientSession() as http:
            now = int(time.time())
            async with http.post(url, data=body, headers=signed("s3cret", body, now)) as ok:
                assert ok.status == 200
            async with http.post(url, data=body, headers=signed("wrong", body, now)) as forged:
                assert forged.status == 401
            async with http.post(url, data=body, headers=signed("s3cret", body, now - 3600)) as replayed:
                assert replayed.status == 401  # an old timestamp: a replayed request
            for timestamp in (None, "", "soon", "１２３", "-5"):  # missing, empty, garbage, non-ASCII digits
                headers = signed("s3cret", body, now)
                if timestamp is None:
                    del headers["X-Slack-Request-Timestamp"]
                else:
                    headers["X-Slack-Request-Timestamp"] = timestamp
                async with http.post(url, data=body, headers=headers) as malformed:
                    assert malformed.status == 400, (timestamp, malformed.status, await malformed.text())
                    assert "Traceback" not in await malformed.text()
        await wait_for(lambda: seen, what="the signed click handled")
        assert len(seen) == 1
    finally:
        await server.close()


def approval_request(key: str, marker: Path, within: float = 600) -> Any:
    return make_request("command", {"argv": [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ran')"]},
                        key=key, approve="#gpu-admins", approve_within=within, destructive=True)


async def approval_posted(slack: FakeSlack) -> dict[str, Any]:
    await wait_for(lambda: [p for p in slack.posted if p["channel"] == "#gpu-admins"], what="the approval posted")
    return next(p for p in slack.posted if p["channel"] == "#gpu-admins")


def answer(post: dict[str, Any], approve: bool, user: str, slack: FakeSlack) -> dict[str, Any]:
    buttons = next(b for b in post["blocks"] if b["type"] == "actions")["elements"]
    button = buttons[0 if approve else 1]
    return {"type": "block_actions", "user": {"id": user}, "response_url": slack.response_url(user),
            "actions": [{"action_id": button["action_id"], "value": button["value"], "action_ts": f"9.{user}"}]}


async def test_a_destructive_action_waits_for_an_approval_from_the_channel(
        config: Config, bus: Bus, slack: FakeSlack, tmp_path: Path) -> None:
    slack.channel_members["#gpu-admins"] = ["U002"]
    marker = tmp_path / "ran"
    async with runner_and_socket(config, bus):
        await wait_for(lambda: len(slack.sockets) == 1, timeout=20, what="the Socket Mode connection")
        req = approval_request("inc-a:fire:0:0", marker)
        await publish_request(bus, req)
        post = await approval_posted(slack)
        assert "Approve `command` on n1/gpu0" in post["text"]
        assert not marker.exists()  # nothing runs before the answer
        await slack.send_interactive("e1", answer(post, True, "U001", slack))  # not a member, not an admin
        await wait_for(lambda: slack.responses, what="the refusal")
        assert "Only a member of #gpu-admins" in slack.responses[0]["text"] and not marker.exists()
        await slack.send_interactive("e2", answer(post, True, "U002", slack))
        await wait_for(marker.exists, timeout=30, what="the approved command to run")
    outcomes = [(r.kind, r.outcome) for r in await audit_records(bus)]
    assert ("action", "ok") in outcomes and ("click", None) in outcomes


async def test_denied_is_refused_and_unanswered_expires(
        config: Config, bus: Bus, slack: FakeSlack, tmp_path: Path) -> None:
    slack.channel_members["#gpu-admins"] = ["U002"]
    async with runner_and_socket(config, bus):
        await wait_for(lambda: len(slack.sockets) == 1, timeout=20, what="the Socket Mode connection")
        await publish_request(bus, approval_request("inc-d:fire:0:0", tmp_path / "denied"))
        post = await approval_posted(slack)
        await slack.send_interactive("e3", answer(post, False, "U003", slack))  # U003 is an admin
        await publish_request(bus, approval_request("inc-e:fire:0:0", tmp_path / "expired", within=1))

        async def outcomes() -> dict[str | None, str | None]:
            return {r.action_key: r.outcome for r in await audit_records(bus) if r.kind == "action"}

        await wait_for(lambda: _both(outcomes), timeout=30, what="both outcomes")
        got = await outcomes()
        assert got == {"inc-d:fire:0:0": "refused", "inc-e:fire:0:0": "expired"}
    assert not (tmp_path / "denied").exists() and not (tmp_path / "expired").exists()
    denied = next(r for r in await audit_records(bus) if r.action_key == "inc-d:fire:0:0")
    assert denied.error == "denied by U003 in #gpu-admins"


async def _both(outcomes: Any) -> bool:
    return len(await outcomes()) == 2
