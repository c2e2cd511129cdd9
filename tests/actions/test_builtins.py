"""command, webhook, publish, function and log, each through the runner."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from actions.escaping import UnsafeValue
from actions.registry import escape_for
from actions.runner import ActionRunner
from actions.specs.publish import PublishParams
from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.yamlpos import LocatedError
from rules.lang.loader import load_rule_set
from rules.lang.templates import compile_params, render_params
from tests.actions.conftest import make_config, make_request
from tests.actions.fakes import FakeWebhook
from tests.waiting import wait_for


async def test_command_runs_the_argv_without_a_shell_and_keeps_its_output() -> None:
    runner = ActionRunner(None, make_config())
    record = await runner.process(make_request("command", {"argv": ["echo", "node n1; rm -rf / $(id)"]}))
    assert record.outcome == "ok"
    assert record.detail == "echo: exit 0; output: node n1; rm -rf / $(id)\n"


async def test_command_output_is_truncated_and_a_nonzero_exit_fails() -> None:
    runner = ActionRunner(None, make_config(actions={"command_output_max": 20}))
    argv = [sys.executable, "-c", "print('x' * 500); raise SystemExit(3)"]
    record = await runner.process(make_request("command", {"argv": argv}))
    assert record.outcome == "failed" and record.attempt == 1
    assert record.error is not None and record.error.startswith(f"{sys.executable}: exit 3; output: " + "x" * 20)
    assert "481 more characters cut" in record.error


async def test_command_times_out_and_is_killed() -> None:
    runner = ActionRunner(None, make_config())
    argv = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(30)"]
    record = await runner.process(make_request("command", {"argv": argv, "timeout": 1.5}))
    assert record.outcome == "failed"
    assert record.error is not None and "timed out after" in record.error and "started" in record.error


async def test_command_that_cannot_start_fails_with_the_reason() -> None:
    record = await ActionRunner(None, make_config()).process(
        make_request("command", {"argv": ["/no/such/program"]}))
    assert record.outcome == "failed" and "cannot run '/no/such/program'" in (record.error or "")


async def test_webhook_sends_the_rendered_json_body_and_headers(webhook: FakeWebhook) -> None:
    runner = ActionRunner(None, make_config())
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
    runner = ActionRunner(None, make_config())
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
    runner = ActionRunner(None, make_config())
    await runner.process(make_request("webhook", params, entity_kind="process"))
    await runner.close()
    sent = json.loads(webhook.requests[0]["body"])
    assert list(sent) == ["text"] and sent["text"] == EVIL


async def test_webhook_mapping_body_values_arrive_exactly_escaped_once(webhook: FakeWebhook) -> None:
    name = 'a"b\\c\nnext line\ttab'
    params = rendered("webhook", {"url": webhook.url(), "body": {"text": "{{ process.name }}",
                                                                 "list": ["{{ process.name }}"]}},
                      process={"name": name})
    runner = ActionRunner(None, make_config())
    await runner.process(make_request("webhook", params, entity_kind="process"))
    await runner.close()
    assert json.loads(webhook.requests[0]["body"]) == {"text": name, "list": [name]}


async def test_webhook_url_value_is_percent_encoded_and_cannot_steer_the_request(webhook: FakeWebhook) -> None:
    name = "x/../../admin?force=1#"
    params = rendered("webhook", {"url": webhook.url("/hooks/") + "{{ process.name }}?who={{ process.name }}"},
                      process={"name": name})
    runner = ActionRunner(None, make_config())
    record = await runner.process(make_request("webhook", params, entity_kind="process"))
    await runner.close()
    assert record.outcome == "ok"
    sent = webhook.requests[0]
    path, _, _ = sent["raw_path"].partition("?")
    assert path.startswith("/hooks/x%2F..%2F..%2Fadmin%3F") and path.count("/") == 2  # one segment
    assert sent["query"] == {"who": name}


def test_a_machine_value_that_would_start_an_option_refuses_the_command() -> None:
    tree, errors = compile_params({"argv": ["rm", "{{ process.name }}"]}, "process", escape_for("command"))
    assert errors == []
    with pytest.raises(UnsafeValue, match="starts with '-'"):
        render_params(tree, {"process": {"name": "-rf"}})
    assert render_params(tree, {"process": {"name": "a-b"}}) == {"argv": ["rm", "a-b"]}


ARGV_ACTIONS = [
    ("command", {}),
    ("cordon", {"provider": "command"}),
    ("uncordon", {"provider": "command"}),
    ("scale", {"provider": "command", "replicas": 0}),
]


@pytest.mark.parametrize(("type_", "extra"), ARGV_ACTIONS, ids=[t for t, _ in ARGV_ACTIONS])
def test_every_action_that_builds_an_argv_refuses_a_machine_value_that_starts_an_option(
        type_: str, extra: dict[str, object]) -> None:
    tree, errors = compile_params({**extra, "argv": ["tool", "--node={{ node }}", "{{ node }}"]}, "process",
                                  escape_for(type_))
    assert errors == []
    with pytest.raises(UnsafeValue, match="starts with '-'"):
        render_params(tree, {"node": "--all"})
    assert render_params(tree, {"node": "n-1"})["argv"] == ["tool", "--node=n-1", "n-1"]


async def test_command_argv_takes_a_hostile_value_as_one_literal_argument() -> None:
    hostile = '$(touch /tmp/gpuevents-pwned); x" ; rm -rf / #'
    params = rendered("command", {"argv": [sys.executable, "-c", "import sys; print(repr(sys.argv[1]))",
                                           "{{ process.name }}"]}, process={"name": hostile})
    record = await ActionRunner(None, make_config()).process(make_request("command", params))
    assert record.outcome == "ok" and repr(hostile) in (record.detail or "")


async def test_webhook_without_a_body_posts_the_incident(webhook: FakeWebhook) -> None:
    runner = ActionRunner(None, make_config())
    req = make_request("webhook", {"url": webhook.url()}, facts={"gpu": {"index": 0}})
    await runner.process(req)
    await runner.close()
    sent = json.loads(webhook.requests[0]["body"])
    assert (sent["rule"], sent["entity_id"], sent["key"], sent["facts"]) == (
        req.rule, req.entity_id, req.key, {"gpu": {"index": 0}})


async def test_webhook_connection_errors_are_retried_then_fail() -> None:
    runner = ActionRunner(None, make_config())
    record = await runner.process(make_request("webhook", {"url": "http://127.0.0.1:9/x", "timeout": 1}))
    await runner.close()
    assert record.outcome == "failed" and record.attempt == 3
    assert "gave up after 3 attempts" in (record.error or "")


async def test_publish_chains_data_onto_a_subject(bus: Bus) -> None:
    got: list[bytes] = []

    async def on_msg(msg: object) -> None:
        got.append(msg.data)  # type: ignore[attr-defined]

    await bus.subscribe("team.ml.gpu-idle", on_msg)
    runner = ActionRunner(bus, make_config())
    record = await runner.process(make_request("publish", {"subject": "team.ml.gpu-idle",
                                                           "data": {"gpu": "n1/gpu0", "hours": 2}}))
    assert record.outcome == "ok"
    assert orjson.loads((await wait_for(lambda: got, what="the published message"))[0]) == {
        "gpu": "n1/gpu0", "hours": 2}


async def test_function_gets_the_incident_and_its_reply_is_the_outcome(bus: Bus) -> None:
    seen: list[dict[str, object]] = []

    async def triage(payload: bytes, subject: str) -> bytes:
        seen.append(orjson.loads(payload))
        return b'{"status": "refused", "detail": "job is on the allow list"}'

    await bus.serve(S.function_subject("acme.triage"), triage)
    runner = ActionRunner(bus, make_config())
    req = make_request("function", {"name": "acme.triage", "data": {"team": "ml"}})
    record = await runner.process(req)
    assert (record.outcome, record.error) == ("refused", "job is on the allow list")
    assert seen[0]["rule"] == req.rule and seen[0]["key"] == req.key and seen[0]["data"] == {"team": "ml"}


async def test_function_that_nobody_serves_is_retried_then_fails(bus: Bus) -> None:
    record = await ActionRunner(bus, make_config()).process(make_request("function", {"name": "missing"}))
    assert record.outcome == "failed" and "no function answers on gpuevents.fn.missing" in (record.error or "")


async def test_log_writes_the_message_and_audits_it() -> None:
    record = await ActionRunner(None, make_config()).process(
        make_request("log", {"message": "idle-gpu-2h resolved on n1/gpu0"}, phase="resolve"))
    assert (record.outcome, record.detail) == ("ok", "idle-gpu-2h resolved on n1/gpu0")


async def test_publish_to_an_event_subject_is_stored_once_per_key(bus: Bus) -> None:
    subject = S.event_subject("default", "n1", "gpu.idle")
    req = make_request("publish", {"subject": subject, "data": {"chained": True}})
    first = await ActionRunner(bus, make_config()).process(req)
    # The same request again (a redelivery after a lost ack) through another runner on the bus.
    again = await ActionRunner(bus, make_config()).process(req)
    stored = [m.data async for m in bus.replay(S.STREAM_EVENTS, S.EVENTS_ALL)]
    assert first.outcome == "ok" and again == first
    assert [orjson.loads(d) for d in stored] == [{"chained": True}]


@pytest.mark.parametrize("subject", [
    "gpuevents.cmd.default.n1.kill", "gpuevents.act.kill", "gpuevents.act", "gpuevents.audit.idle",
    "gpuevents.fn.acme.triage", "gpuevents.dlq.x", "$JS.API.STREAM.DELETE.GPUEVENTS", "$KV.gpuevents.k",
    "_INBOX.abc"])
def test_publish_refuses_reserved_subjects(subject: str) -> None:
    with pytest.raises(ValidationError, match="is reserved"):
        PublishParams.model_validate({"type": "publish", "subject": subject})
    PublishParams.model_validate({"type": "publish", "subject": "team.gpuevents.cmd"})  # elsewhere: fine


def test_publish_to_a_command_subject_is_a_load_error_with_its_line(tmp_path: Path) -> None:
    f = tmp_path / "sneaky.yaml"
    f.write_text("rules:\n  - name: sneaky\n    entity: gpu\n    when: gpu.idle\n    actions:\n"
                 "      - type: publish\n        subject: gpuevents.cmd.default.n1.kill\n")
    with pytest.raises(LocatedError) as e:
        load_rule_set([f])
    assert [(p.line, "publish.subject" in p.message, "reserved" in p.message) for p in e.value.problems] == [
        (7, True, True)]


async def test_publish_refuses_a_reserved_subject_rendered_at_run_time(bus: Bus) -> None:
    record = await ActionRunner(bus, make_config()).process(
        make_request("publish", {"subject": "gpuevents.act.kill", "data": {}}))
    assert record.outcome == "refused" and "is reserved" in (record.error or "")
