"""The notify action through Apprise itself, against local servers that speak each service's webhook format."""

from __future__ import annotations

import email
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from actions.escaping import UnsafeValue
from actions.registry import escape_for
from actions.runner import ActionRunner
from gpuevents.config import Config
from gpuevents.server import free_port
from rules.lang.templates import compile_params, render_params
from tests.actions.conftest import make_config, make_request
from tests.actions.notify_servers import ConnectProxy, WebhookServices, self_signed

TOKEN = "abcdefghijklmnopqrstuvwxyz"


@pytest.fixture
async def plain() -> AsyncIterator[WebhookServices]:
    server = WebhookServices()
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
async def tls(tmp_path: Path) -> AsyncIterator[WebhookServices]:
    server = WebhookServices(self_signed(tmp_path))
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
async def proxy(tls: WebhookServices, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ConnectProxy]:
    """Discord and Google Chat go to their own hosts over HTTPS: through this proxy, to the local TLS server."""
    p = ConnectProxy(tls.port)
    port = await p.start()
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    try:
        yield p
    finally:
        await p.close()


def notify_config(services: dict[str, Any], owners: dict[str, Any] | None = None, **retry: Any) -> Config:
    actions: dict[str, Any] = {"notify": {"services": services}}
    if retry:
        actions["retry"] = {"max_attempts": 3, "backoff": 0.05, "backoff_max": 0.1, **retry}
    return make_config(actions=actions, owners=owners or {})


def rendered(params: dict[str, Any], values: dict[str, Any], kind: str = "process") -> dict[str, Any]:
    """Parameters as the engine renders them: every `{{ }}` output through the notify action's escapes."""
    tree, errors = compile_params(params, kind, escape_for("notify"))
    assert errors == []
    return render_params(tree, values)


async def test_a_post_reaches_a_mattermost_channel(plain: WebhookServices) -> None:
    config = notify_config({"mattermost": {"url": f"mmost://127.0.0.1:{plain.port}/{TOKEN}?channel=%23gpu"}})
    record = await (await ActionRunner.open(None, config)).process(
        make_request("notify", {"to": "mattermost", "text": "GPU 0 on n1 has been idle for 2h"}))
    assert record.outcome == "ok" and record.detail == "posted to mattermost (channel)"
    [post] = plain.of("mattermost")
    assert post["path"] == f"/hooks/{TOKEN}" and post["body"]["channel"] == "gpu"
    assert "GPU 0 on n1 has been idle for 2h" in post["body"]["text"]


async def test_the_channel_url_comes_from_the_environment(plain: WebhookServices,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MM_URL", f"mmost://127.0.0.1:{plain.port}/{TOKEN}")
    config = notify_config({"mattermost": {"url_env": "MM_URL"}})
    record = await (await ActionRunner.open(None, config)).process(
        make_request("notify", {"to": "mattermost", "text": "hi"}))
    assert record.outcome == "ok" and len(plain.of("mattermost")) == 1
    assert TOKEN not in record.model_dump_json()  # the audit never shows the URL


async def test_a_missing_url_variable_is_refused_with_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOPE_URL", raising=False)
    config = notify_config({"teams": {"url_env": "NOPE_URL"}})
    record = await (await ActionRunner.open(None, config)).process(
        make_request("notify", {"to": "teams", "text": "hi"}))
    assert record.outcome == "failed" and record.attempt == 1 and "$NOPE_URL" in (record.error or "")


async def test_machine_values_cannot_ping_everyone_on_mattermost(plain: WebhookServices) -> None:
    config = notify_config({"mattermost": {"url": f"mmost://127.0.0.1:{plain.port}/{TOKEN}"}})
    params = rendered({"to": "mattermost", "text": "{{ process.name }} is idle: [see](https://ok.example)"},
                      {"process": {"name": "@channel [x](https://evil.example) **bold**"}})
    record = await (await ActionRunner.open(None, config)).process(make_request("notify", params))
    assert record.outcome == "ok"
    text = plain.of("mattermost")[0]["body"]["text"]
    assert "@channel" not in text and "@\u200bchannel" in text
    assert "[x](https://evil.example)" not in text and "\\*\\*bold\\*\\*" in text
    assert "[see](https://ok.example)" in text  # the rule author's own Markdown is left as written
    assert record.params["text"] == "@channel [x](https://evil.example) **bold** is idle: [see](https://ok.example)"


async def test_machine_values_cannot_ping_on_discord(tls: WebhookServices, proxy: ConnectProxy) -> None:
    config = notify_config({"discord": {"url": "discord://123456/abcdefghijk?verify=no"}})
    params = rendered({"to": "discord", "text": "{{ process.name }} holds GPU 0"},
                      {"process": {"name": "@everyone <@123456789>"}})
    record = await (await ActionRunner.open(None, config)).process(make_request("notify", params))
    assert record.outcome == "ok", record.error
    [post] = tls.of("discord")
    assert post["host"] == "discord.com" and proxy.connects == ["discord.com:443"]
    assert post["path"] == "/api/webhooks/123456/abcdefghijk"
    assert "allow_mentions" not in post["body"]  # Discord itself pings what it finds in the content
    assert "@everyone" not in post["body"]["content"] and "<@123456789>" not in post["body"]["content"]
    assert "holds GPU 0" in post["body"]["content"]


async def test_a_rule_author_may_still_ping_on_discord(tls: WebhookServices, proxy: ConnectProxy) -> None:
    config = notify_config({"discord": {"url": "discord://123456/abcdefghijk?verify=no"}})
    record = await (await ActionRunner.open(None, config)).process(
        make_request("notify", {"to": "discord", "text": "@here the fleet is on fire"}))
    assert record.outcome == "ok"
    assert tls.of("discord")[0]["body"]["content"].endswith("@here the fleet is on fire")  # Discord pings


async def test_a_post_reaches_google_chat(tls: WebhookServices, proxy: ConnectProxy) -> None:
    config = notify_config({"gchat": {"url": "gchat://space1/key1/token1?verify=no"}})
    params = rendered({"to": "gchat", "text": "{{ process.name }} idle"}, {"process": {"name": "<users/all>"}})
    record = await (await ActionRunner.open(None, config)).process(make_request("notify", params))
    assert record.outcome == "ok", record.error
    [post] = tls.of("gchat")
    assert post["host"] == "chat.googleapis.com" and post["path"] == "/v1/spaces/space1/messages"
    assert "idle" in post["body"]["text"] and "<users/all>" not in post["body"]["text"]


async def test_a_post_reaches_a_teams_workflow(tls: WebhookServices) -> None:
    config = notify_config({"teams": {"url": f"workflows://127.0.0.1:{tls.port}/wf1/sig1?verify=no"}})
    params = rendered({"to": "teams", "title": "GPU idle on {{ node.name }}", "text": "{{ process.name }} idle"},
                      {"process": {"name": "[click](https://evil.example)"}, "node": {"name": "n1"}})
    record = await (await ActionRunner.open(None, config)).process(make_request("notify", params))
    assert record.outcome == "ok", record.error
    [post] = tls.of("teams")
    card = post["body"]["attachments"][0]["content"]
    texts = {b.get("id"): b.get("text") for b in card["body"]}
    assert texts["title"] == "GPU idle on n1"
    assert "idle" in texts["body"] and "](https://evil.example)" not in texts["body"]


async def test_a_json_webhook_gets_the_idempotency_key(plain: WebhookServices) -> None:
    config = notify_config({})
    request = make_request("notify", {"to": f"json://127.0.0.1:{plain.port}/hook", "text": "hi", "title": "t"})
    record = await (await ActionRunner.open(None, config)).process(request)
    assert record.outcome == "ok"
    [post] = plain.of("json")
    assert post["headers"]["Idempotency-Key"] == request.key
    assert (post["body"]["title"], post["body"]["message"]) == ("t", "hi")


async def test_a_failed_post_is_retried_then_works(plain: WebhookServices) -> None:
    plain.statuses = [503]
    config = notify_config({"mattermost": {"url": f"mmost://127.0.0.1:{plain.port}/{TOKEN}"}}, max_attempts=3)
    record = await (await ActionRunner.open(None, config)).process(
        make_request("notify", {"to": "mattermost", "text": "x"}))
    assert record.outcome == "ok" and record.attempt == 2 and len(plain.of("mattermost")) == 2


async def test_a_post_that_keeps_failing_ends_failed_with_aprises_reason(plain: WebhookServices) -> None:
    plain.statuses = [500, 500]
    config = notify_config({"mattermost": {"url": f"mmost://127.0.0.1:{plain.port}/{TOKEN}"}}, max_attempts=2)
    record = await (await ActionRunner.open(None, config)).process(
        make_request("notify", {"to": "mattermost", "text": "x"}))
    assert record.outcome == "failed" and record.attempt == 2
    assert "Mattermost" in (record.error or "") and "500" in (record.error or "")


async def test_an_unknown_url_is_refused_without_retrying() -> None:
    record = await (await ActionRunner.open(None, notify_config({}, max_attempts=3))).process(
        make_request("notify", {"to": "nosuchservice://x/y", "text": "x"}))
    assert record.outcome == "failed" and record.attempt == 1 and "does not know" in (record.error or "")


# ---------------------------------------------------------------- owners
class Inbox:
    def __init__(self) -> None:
        self.messages: list[tuple[list[str], email.message.Message]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append((list(envelope.rcpt_tos), email.message_from_bytes(envelope.content)))
        return "250 OK"


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    inbox, port = Inbox(), free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


def mail_service(port: int) -> dict[str, Any]:
    return {"direct_url": f"mailto://127.0.0.1:{port}?to={{to}}&from=gpuevents@hpc.example.org&secure=no"}


async def test_an_owner_is_mailed_at_the_address_of_the_owner_map(smtp: tuple[Inbox, int]) -> None:
    inbox, port = smtp
    owners = {"alice": {"slack": "U001", "email": "alice@hpc.example.org", "mattermost": "#alice-alerts"}}
    config = notify_config({"email": mail_service(port)}, owners)
    assert config.owners == {"alice": "U001"}  # what rules see as the owner: her Slack address
    params = rendered({"service": "email", "to": "{{ gpu.owner }}", "text": "GPU {{ gpu.index }} idle"},
                      {"gpu": {"owner": "U001", "index": 3}}, kind="gpu")
    record = await (await ActionRunner.open(None, config)).process(make_request("notify", params))
    assert record.outcome == "ok", record.error
    [(rcpts, msg)] = inbox.messages
    body = msg.get_payload(decode=True)
    assert rcpts == ["alice@hpc.example.org"] and isinstance(body, bytes) and "GPU 3 idle" in body.decode()
    assert record.detail == "posted to email → alice@hpc.example.org"


async def test_an_owner_with_no_address_for_the_service_is_refused(smtp: tuple[Inbox, int]) -> None:
    inbox, port = smtp
    config = notify_config({"email": mail_service(port)}, {"bob": "bob@hpc.example.org"}, max_attempts=3)
    record = await (await ActionRunner.open(None, config)).process(
        make_request("notify", {"service": "email", "to": "bob", "text": "x"}))
    assert record.outcome == "failed" and record.attempt == 1
    assert "'bob' has no email address" in (record.error or "") and inbox.messages == []


async def test_owner_as_address_uses_the_owners_name_as_it_is(smtp: tuple[Inbox, int]) -> None:
    inbox, port = smtp
    config = notify_config({"email": {**mail_service(port), "owner_as_address": True}})
    record = await (await ActionRunner.open(None, config)).process(
        make_request("notify", {"service": "email", "to": "carol@hpc.example.org", "text": "x"}))
    assert record.outcome == "ok" and inbox.messages[0][0] == ["carol@hpc.example.org"]


async def test_an_owner_is_paged_on_opsgenie_as_a_user(tls: WebhookServices, proxy: ConnectProxy) -> None:
    owners = {"alice": {"email": "alice@hpc.example.org", "opsgenie": "@alice"}}
    config = notify_config({"opsgenie": {"direct_url": "opsgenie://apikey123/{to}?verify=no"}}, owners)
    request = make_request("notify", {"service": "opsgenie", "to": "alice@hpc.example.org", "text": "GPU 0 idle"})
    record = await (await ActionRunner.open(None, config)).process(request)
    assert record.outcome == "ok", record.error
    [post] = tls.of("opsgenie")
    assert post["host"] == "api.opsgenie.com" and post["headers"]["Authorization"] == "GenieKey apikey123"
    assert post["body"]["responders"] == [{"type": "user", "username": "alice"}]
    assert post["body"]["alias"] == request.incident_id  # Opsgenie de-duplicates an incident's alerts by alias


async def test_a_resolution_to_opsgenie_is_refused_rather_than_sending_nothing(tls: WebhookServices,
                                                                               proxy: ConnectProxy) -> None:
    config = notify_config({"opsgenie": {"url": "opsgenie://apikey123/@ops?verify=no"}})
    record = await (await ActionRunner.open(None, config)).process(
        make_request("notify", {"to": "opsgenie", "text": "GPU 0 busy again"}, phase="resolve"))
    assert record.outcome == "refused" and "closes only Opsgenie alerts it opened" in (record.detail or "")
    assert tls.of("opsgenie") == []


def test_a_recipient_from_the_machine_must_be_one_person() -> None:
    tree, errors = compile_params({"service": "email", "to": "{{ gpu.owner }}", "text": "x"}, "gpu",
                                  escape_for("notify"))
    assert errors == []
    for bad in ("@everyone", "channel", "json://evil.example/x", "a@x.org, b@y.org"):
        with pytest.raises(UnsafeValue):
            render_params(tree, {"gpu": {"owner": bad}})
    assert render_params(tree, {"gpu": {"owner": "alice@x.org"}})["to"] == "alice@x.org"


def test_the_string_form_of_owners_still_works() -> None:
    config = make_config(owners={"alice": "alice@x.org", "bob": {"email": "bob@x.org", "teams": "bob@corp"}})
    assert config.owners == {"alice": "alice@x.org", "bob": "bob@x.org"}
    assert config.owner_address("bob@x.org", "teams") == "bob@corp"
    assert config.owner_address("bob", "teams") == "bob@corp"
    assert config.owner_address("alice", "teams") is None
