"""The slack action through the real slack-sdk against a local Slack Web API."""

from __future__ import annotations

import json

import pytest

from actions.builtin import slack as slack_module
from actions.escaping import UnsafeValue
from actions.registry import escape_for
from actions.runner import ActionRunner
from gpuevents.bus import Bus
from gpuevents.records import AuditRecord
from rules.lang.templates import compile_params, render_params
from tests.actions.conftest import T0, audit_records, make_config, make_request, publish_request
from tests.actions.fakes import FakeSlack, Injected
from tests.waiting import wait_for


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test")
    return "xoxb-test"


async def runner_for(slack: FakeSlack, **extra: object) -> ActionRunner:
    return await ActionRunner.open(None, make_config(actions={"slack": {"base_url": slack.base_url, **extra}}))


def gpu_facts(process_name: str = "python train.py") -> dict[str, object]:
    return {
        "node": {"name": "n1", "labels": {}},
        "gpu": {"node": "n1", "index": 0, "model": "NVIDIA H100"},
        "processes": [{"pid": 4242, "user": "alice", "name": process_name, "create_time": T0.isoformat()}],
        "incident": {"firing_since": T0.isoformat(), "firing_for": "2h 5m"},
        "cost": {"amount": 12.4, "currency": "USD"},
    }


def all_text(message: dict[str, object]) -> str:
    return json.dumps(message)


async def test_dm_by_email_reaches_that_user_with_the_facts(slack: FakeSlack, token: str) -> None:
    runner = await runner_for(slack)
    req = make_request("slack", {"to": "bob@example.com", "text": "GPU 0 on n1 idle for 2h 5m"},
                       facts=gpu_facts())
    record = await runner.process(req)
    assert record.outcome == "ok", record
    assert [p["channel"] for p in slack.posted] == ["DU002"]
    msg = all_text(slack.posted[0])
    for expected in ("GPU 0 on n1 idle", "NVIDIA H100", "idle-gpu-2h", "12.40 USD",
                     "gpuevents snooze idle-gpu-2h n1/gpu0 --for 4h", "2h 5m"):
        assert expected in msg
    assert slack.calls == ["users.lookupByEmail", "conversations.open", "chat.postMessage"]
    assert "Bearer xoxb-test" in slack.tokens


async def test_handle_is_found_through_users_list_across_pages(slack: FakeSlack, token: str) -> None:
    runner = await runner_for(slack)
    first = await runner.process(make_request("slack", {"to": "@carol", "text": "hi"}))
    second = await runner.process(make_request("slack", {"to": "@bobby", "text": "hi"}))
    assert (first.outcome, second.outcome) == ("ok", "ok")
    assert [p["channel"] for p in slack.posted] == ["DU003", "DU002"]
    assert slack.calls.count("users.list") == 2  # two pages once; the second handle came from the cache


async def test_user_id_and_channel_need_no_lookup(slack: FakeSlack, token: str) -> None:
    runner = await runner_for(slack)
    await runner.process(make_request("slack", {"to": "U001", "text": "hi"}))
    await runner.process(make_request("slack", {"to": "#gpu-waste", "text": "hi"}))
    assert [p["channel"] for p in slack.posted] == ["DU001", "#gpu-waste"]
    assert "users.lookupByEmail" not in slack.calls and "users.list" not in slack.calls


async def test_machine_text_cannot_ping_a_channel(slack: FakeSlack, token: str) -> None:
    runner = await runner_for(slack)
    evil = "<!channel> x <@U002> & <!here>"
    # The engine renders machine values through the action's escape; the facts are escaped here.
    text = f"process {slack_module.SlackAction.escape(evil)} idles"
    await runner.process(make_request("slack", {"to": "U001", "text": text}, facts=gpu_facts(evil)))
    msg = all_text(slack.posted[0])
    assert "<!channel>" not in msg and "<!here>" not in msg and "<@U002>" not in msg
    assert "&lt;!channel&gt; x &lt;@U002&gt; &amp; &lt;!here&gt;" in msg


async def test_a_429_is_waited_out(slack: FakeSlack, token: str) -> None:
    slack.inject["chat.postMessage"].append(
        Injected(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "1"}))
    record = await (await runner_for(slack)).process(make_request("slack", {"to": "U001", "text": "hi"}))
    assert record.outcome == "ok" and record.attempt == 2
    assert len(slack.posted) == 1


async def test_a_5xx_is_retried(slack: FakeSlack, token: str) -> None:
    slack.inject["conversations.open"].append(Injected(503, {"ok": False, "error": "down"}))
    record = await (await runner_for(slack)).process(make_request("slack", {"to": "U002", "text": "hi"}))
    assert record.outcome == "ok" and record.attempt == 2
    assert [p["channel"] for p in slack.posted] == ["DU002"]


async def test_persistent_5xx_gives_up_after_max_attempts(slack: FakeSlack, token: str) -> None:
    slack.inject["chat.postMessage"].extend(Injected(500) for _ in range(5))
    record = await (await runner_for(slack)).process(make_request("slack", {"to": "U002", "text": "hi"}))
    assert record.outcome == "failed" and record.attempt == 3
    assert record.error is not None and "gave up after 3 attempts" in record.error
    assert slack.posted == []


async def test_unknown_email_fails_with_the_reason(slack: FakeSlack, token: str) -> None:
    record = await (await runner_for(slack)).process(make_request("slack", {"to": "nobody@example.com", "text": "hi"}))
    assert record.outcome == "failed"
    assert record.error == "no Slack user with email nobody@example.com"
    assert record.attempt == 1  # not retried
    assert slack.posted == []


async def test_empty_recipient_is_refused_with_its_location(slack: FakeSlack, token: str) -> None:
    record = await (await runner_for(slack)).process(make_request("slack", {"to": "", "text": "hi"}))
    assert record.outcome == "refused"
    assert record.error is not None and record.error.startswith("slack parameters: to:")


async def test_without_a_token_the_message_is_printed_not_delivered_and_warned_once(
        slack: FakeSlack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    monkeypatch.setattr(slack_module, "_warned_no_token", False)
    runner = await runner_for(slack)
    first = await runner.process(make_request("slack", {"to": "alice@example.com", "text": "GPU idle"}))
    second = await runner.process(make_request("slack", {"to": "bob@example.com", "text": "GPU busy"}))
    assert first.outcome == second.outcome == "refused"  # printing is not delivery (DESIGN §3.4)
    assert first.error == "printed to the console, not delivered: SLACK_BOT_TOKEN is not set"
    out = capsys.readouterr().out
    assert "[slack → alice@example.com] GPU idle" in out and "[slack → bob@example.com] GPU busy" in out
    warnings = [r for r in caplog.records if "SLACK_BOT_TOKEN" in r.getMessage()]
    assert len(warnings) == 1
    assert slack.calls == []


async def test_digest_sends_one_dm_listing_every_incident_of_the_owner(slack: FakeSlack, token: str) -> None:
    import asyncio

    runner = await runner_for(slack)
    reqs = [make_request("slack", {"to": "alice@example.com", "text": f"GPU {i} idle", "digest": True,
                                   "digest_window": 0.5}, entity_id=f"n1/gpu{i}") for i in range(3)]
    other = make_request("slack", {"to": "bob@example.com", "text": "GPU 7 idle", "digest": True,
                                   "digest_window": 0.5}, entity_id="n1/gpu7")
    records = await asyncio.gather(*(runner.process(r) for r in [*reqs, other]))
    assert all(r.outcome == "ok" for r in records)
    assert sorted(r.detail or "" for r in records) == [
        "digest of 1 sent to bob@example.com", "digest of 3 sent to alice@example.com",
        "queued in the digest for alice@example.com", "queued in the digest for alice@example.com"]
    alice = slack.dms_to("U001")
    assert len(alice) == 1 and len(slack.dms_to("U002")) == 1
    assert all(f"GPU {i} idle" in all_text(alice[0]) for i in range(3))


async def test_digest_through_the_queue_waits_out_the_window_then_sends_once(
        slack: FakeSlack, token: str, bus: Bus) -> None:
    import asyncio

    runner = await ActionRunner.open(bus, make_config(actions={"slack": {"base_url": slack.base_url}}))
    stop = asyncio.Event()
    loop = asyncio.create_task(runner.run(stop))
    for i in range(2):
        await publish_request(bus, make_request("slack", {"to": "U003", "text": f"GPU {i} idle", "digest": True,
                                                          "digest_window": 0.5}, entity_id=f"n1/gpu{i}"))
    records = await wait_for(lambda: _two(bus), what="two audit records")
    stop.set()
    await loop
    assert sorted(r.detail or "" for r in records) == ["digest of 2 sent to U003", "queued in the digest for U003"]
    assert len(slack.dms_to("U003")) == 1
    assert "GPU 0 idle" in all_text(slack.posted[0]) and "GPU 1 idle" in all_text(slack.posted[0])


async def _two(bus: Bus) -> list[AuditRecord] | None:
    records = await audit_records(bus)
    return records if len(records) >= 2 else None


async def test_text_objects_are_verbatim_so_a_plain_at_here_stays_text(slack: FakeSlack, token: str) -> None:
    runner = await runner_for(slack)
    await runner.process(make_request("slack", {"to": "U001", "text": "job @here idles"}, facts=gpu_facts()))
    posted = slack.posted[0]
    blocks = posted["blocks"] if isinstance(posted["blocks"], list) else json.loads(posted["blocks"])
    objects = [t for b in blocks for t in [b.get("text"), *b.get("fields", []), *b.get("elements", [])]]
    texts = [t for t in objects if isinstance(t, dict) and t.get("type") == "mrkdwn"]
    assert texts and all(t.get("verbatim") is True for t in texts)
    assert posted.get("parse") == "none"


@pytest.mark.parametrize("owner", ["#general", "C0123456789", "<!channel>", "alice bob", "@here x", "@here", "channel"])
def test_a_recipient_from_the_machine_must_be_a_person(owner: str) -> None:
    tree, errors = compile_params({"to": "{{ gpu.owner }}", "text": "hi"}, "gpu", escape_for("slack"))
    assert errors == []
    with pytest.raises(UnsafeValue, match="not a person"):
        render_params(tree, {"gpu": {"owner": owner}})


@pytest.mark.parametrize("owner", ["alice", "@alice", "alice@example.com", "U0123ABC", "j.o'neil"])
def test_a_person_from_the_machine_is_a_recipient(owner: str) -> None:
    tree, _ = compile_params({"to": "{{ gpu.owner }}", "text": "hi"}, "gpu", escape_for("slack"))
    assert render_params(tree, {"gpu": {"owner": owner}})["to"] == owner


async def test_a_digest_has_each_items_keep_buttons_and_the_money_in_the_heading(slack: FakeSlack, token: str) -> None:
    import asyncio

    from actions.slack_clicks import SentMessage, sent_key

    runner = await runner_for(slack)
    reqs = [make_request("slack", {"to": "alice@example.com", "text": f"GPU {i} idle", "digest": True,
                                   "digest_window": 0.5, "buttons": {"keep": ["4h", "1d"]}},
                         entity_id=f"n1/gpu{i}", facts={"cost": {"amount": 2.5, "currency": "USD"}})
            for i in range(2)]
    await asyncio.gather(*(runner.process(r) for r in reqs))
    [dm] = slack.dms_to("U001")
    assert "about 5.00 USD of idle GPU time so far" in dm["blocks"][0]["text"]["text"]
    values = [b["elements"][0]["value"] for b in dm["blocks"] if b["type"] == "actions"]
    assert sorted(values) == sorted(r.key for r in reqs)  # each item's buttons act on its own incident
    kv = runner.services.kv
    for r in reqs:
        got = await kv.get(sent_key(r.key))
        assert got is not None and SentMessage.model_validate_json(got.value).request.entity_id == r.entity_id


def test_a_long_digest_stays_within_slacks_fifty_blocks() -> None:
    from actions import slack_format as fmt

    items = [fmt.MessageItem(text=f"GPU {i}", rule="r", entity_id=f"n/gpu{i}", buttons=[14400.0],
                             request={"key": f"k{i}"}) for i in range(40)]
    blocks = fmt.digest_blocks(items, 900)
    assert len(blocks) <= fmt.MAX_BLOCKS
    assert blocks[-1]["elements"][0]["text"].startswith("… and ")
