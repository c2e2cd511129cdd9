"""The webhook action against a local HTTP server: the rendered body and headers, hostile values kept inside
their JSON string or URL segment, the incident as the default body, connection errors retried then failed."""

from __future__ import annotations

import json

from actions.registry import escape_for
from actions.runner import ActionRunner
from rules.lang.templates import compile_params, render_params
from tests.actions.conftest import make_config, make_request
from tests.actions.fakes import FakeWebhook


async def test_webhook_sends_the_rendered_json_body_and_headers(webhook: FakeWebhook) -> None:
    runner = await ActionRunner.open(None, make_config())
    body = '{"text": "GPU 0 idle", "n": 2}'
    record = await runner.process(make_request("webhook", {"url": webhook.url("/in"), "method": "PUT",
                                                           "headers": {"X-Team": "ml"}, "body": body}))
    await runner.close()
    assert record.outcome == "ok" and record.detail == f"PUT {webhook.url('/in')} -> HTTP 200"
    sent = webhook.requests[0]
    assert sent["method"] == "PUT" and sent["headers"]["X-Team"] == "ml"
    assert sent["headers"]["Content-Type"] == "application/json"
    assert json.loads(sent["body"]) == {"text": "GPU 0 idle", "n": 2}


def rendered(type_: str, params: dict[str, object], **names: object) -> dict[str, object]:
    """The parameters as the engine renders them: compiled with the action's escape, then rendered."""
    tree, errors = compile_params(params, "process", escape_for(type_))
    assert errors == []
    return render_params(tree, names)


EVIL = 'x", "channel": "#general'


async def test_webhook_string_body_keeps_a_hostile_process_name_inside_its_string(webhook: FakeWebhook) -> None:
    process = {"name": EVIL + "\\ \n", "user": "bob\r\nX-Injected: 1"}
    params = rendered("webhook", {"url": webhook.url(), "body": '{"text": "{{ process.name }} idles"}',
                                  "headers": {"X-User": "{{ process.user }}"}}, process=process)
    runner = await ActionRunner.open(None, make_config())
    record = await runner.process(make_request("webhook", params, entity_kind="process"))
    await runner.close()
    assert record.outcome == "ok"
    sent = webhook.requests[0]
    assert sent["headers"]["Content-Type"] == "application/json"
    assert json.loads(sent["body"]) == {"text": EVIL + "\\ \n idles"}
    assert "X-Injected" not in sent["headers"] and sent["headers"]["X-User"] == "bob X-Injected: 1"


async def test_webhook_mapping_body_stays_one_value_per_key(webhook: FakeWebhook) -> None:
    params = rendered("webhook", {"url": webhook.url(), "body": {"text": "{{ process.name }}"}},
                      process={"name": EVIL})
    runner = await ActionRunner.open(None, make_config())
    await runner.process(make_request("webhook", params, entity_kind="process"))
    await runner.close()
    sent = json.loads(webhook.requests[0]["body"])
    assert list(sent) == ["text"] and sent["text"] == EVIL


async def test_webhook_mapping_body_values_arrive_exactly_escaped_once(webhook: FakeWebhook) -> None:
    name = 'a"b\\c\nnext line\ttab'
    params = rendered("webhook", {"url": webhook.url(), "body": {"text": "{{ process.name }}",
                                                                 "list": ["{{ process.name }}"]}},
                      process={"name": name})
    runner = await ActionRunner.open(None, make_config())
    await runner.process(make_request("webhook", params, entity_kind="process"))
    await runner.close()
    assert json.loads(webhook.requests[0]["body"]) == {"text": name, "list": [name]}


async def test_webhook_url_value_is_percent_encoded_and_cannot_steer_the_request(webhook: FakeWebhook) -> None:
    name = "x/../../admin?force=1#"
    params = rendered("webhook", {"url": webhook.url("/hooks/") + "{{ process.name }}?who={{ process.name }}"},
                      process={"name": name})
    runner = await ActionRunner.open(None, make_config())
    record = await runner.process(make_request("webhook", params, entity_kind="process"))
    await runner.close()
    assert record.outcome == "ok"
    sent = webhook.requests[0]
    path, _, _ = sent["raw_path"].partition("?")
    assert path.startswith("/hooks/x%2F..%2F..%2Fadmin%3F") and path.count("/") == 2  # one segment
    assert sent["query"] == {"who": name}


async def test_webhook_without_a_body_posts_the_incident(webhook: FakeWebhook) -> None:
    runner = await ActionRunner.open(None, make_config())
    req = make_request("webhook", {"url": webhook.url()}, facts={"gpu": {"index": 0}})
    await runner.process(req)
    await runner.close()
    sent = json.loads(webhook.requests[0]["body"])
    assert (sent["rule"], sent["entity_id"], sent["key"], sent["facts"]) == (
        req.rule, req.entity_id, req.key, {"gpu": {"index": 0}})


async def test_webhook_connection_errors_are_retried_then_fail() -> None:
    runner = await ActionRunner.open(None, make_config())
    record = await runner.process(make_request("webhook", {"url": "http://127.0.0.1:9/x", "timeout": 1}))
    await runner.close()
    assert record.outcome == "failed" and record.attempt == 3
    assert "gave up after 3 attempts" in (record.error or "")
