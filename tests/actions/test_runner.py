"""The runner on a real nats-server: decisions, limits, protection, dry run, idempotency, retries, the queue."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from nats.js import JetStreamContext

from actions.runner import ActionRunner, redact
from gpuevents import subjects as S
from gpuevents.bus import Bus, Message
from gpuevents.commands import KillCommand, KillReply
from tests.actions.conftest import audit_records, make_config, make_request, process_facts, publish_request
from tests.actions.fakes import FakeWebhook
from tests.waiting import wait_for


class KillResponder:
    """A stand-in agent for node n1: records commands, answers `exited`."""

    def __init__(self) -> None:
        self.commands: list[KillCommand] = []

    async def handle(self, msg: Message) -> bytes:
        cmd = KillCommand.model_validate_json(msg.data)
        self.commands.append(cmd)
        return KillReply(outcome="exited", pid=cmd.pid, signal=cmd.signal).model_dump_json().encode()


@pytest.fixture
async def agent(bus: Bus) -> KillResponder:
    responder = KillResponder()
    await bus.serve(S.command_subject("default", "n1", "kill"), responder.handle)
    return responder


@pytest.fixture(autouse=True)
def no_slack_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)


async def test_kill_on_a_gpu_asks_the_agent_about_every_process(bus: Bus, agent: KillResponder) -> None:
    runner = await ActionRunner.open(bus, make_config())
    req = make_request("kill", {"signal": "INT", "grace": "5s"},
                       facts=process_facts((101, "alice", "python"), (102, "bob", "python")))
    record = await runner.process(req)
    assert record.outcome == "ok", record
    assert sorted(c.pid for c in agent.commands) == [101, 102]
    assert {(c.signal, c.grace_s, c.rule, c.key) for c in agent.commands} == {("INT", 5.0, req.rule, req.key)}
    assert record.detail == "pid 101 exited; pid 102 exited"
    assert [r.outcome for r in await audit_records(bus)] == ["ok"]


async def test_protected_users_are_never_killed(bus: Bus, agent: KillResponder) -> None:
    runner = await ActionRunner.open(bus, make_config())
    record = await runner.process(make_request(
        "kill", {}, facts=process_facts((101, "alice", "python"), (7, "root", "nvidia-persistenced"))))
    assert record.outcome == "refused"
    assert record.error == "protected: user root (pid 7)"
    assert agent.commands == []


async def test_protected_name_patterns_and_node_labels_refuse_destructive_actions(bus: Bus) -> None:
    runner = await ActionRunner.open(bus, make_config(protect={"process_patterns": ["jupyter*"],
                                                               "node_labels": {"tier": "prod"}}))
    by_name = await runner.process(make_request("kill", {}, facts=process_facts((5, "alice", "jupyter-lab"))))
    facts = {"node": {"name": "n1", "labels": {"tier": "prod"}}}
    by_label = await runner.process(make_request("cordon", {}, entity_kind="node", entity_id="n1", facts=facts))
    notify = await runner.process(make_request("log", {"message": "still told"}, facts=facts))
    assert by_name.error == "protected: program /usr/bin/jupyter-lab matches protected pattern 'jupyter*'"
    assert by_label.error == "protected: node label tier=prod"
    assert notify.outcome == "ok"


async def test_held_destructive_actions_are_audited_while_slack_still_goes(
        bus: Bus, agent: KillResponder, capsys: pytest.CaptureFixture[str]) -> None:
    runner = await ActionRunner.open(bus, make_config())
    held = make_request("kill", {}, decision="held", reason="max_fleet_pct 25 exceeded: 40% firing",
                        facts=process_facts((101, "alice", "python")))
    note = make_request("slack", {"to": "alice@example.com", "text": "your GPU idles"}, key=held.key + ":slack")
    suppressed = make_request("kill", {}, decision="suppressed", reason="max_per_hour 20")
    outcomes = [(await runner.process(r)).outcome for r in (held, note, suppressed)]
    assert outcomes == ["held", "refused", "suppressed"]
    assert agent.commands == []
    assert "your GPU idles" in capsys.readouterr().out
    audit = await audit_records(bus)
    assert [(r.action_type, r.outcome, r.detail) for r in audit] == [
        ("kill", "held", "max_fleet_pct 25 exceeded: 40% firing"),
        ("slack", "refused", "printed to the console, not delivered: SLACK_BOT_TOKEN is not set"),
        ("kill", "suppressed", "max_per_hour 20")]


async def test_runners_charge_no_rate_limit_of_their_own_so_restores_are_never_suppressed(
        bus: Bus, webhook: FakeWebhook) -> None:
    """The engine counts `max_per_hour` (per rule and fleet-wide) and promises never to limit a restore: a runner
    that charged the fleet-wide limit again suppressed `scale: previous` and left a workload at 0 replicas."""
    config = make_config(engine={"limits": {"webhook": {"max_per_hour": 2}, "scale": {"max_per_hour": 1}}})
    one, two = await ActionRunner.open(bus, config, name="a"), await ActionRunner.open(bus, config, name="b")
    reqs = [make_request("webhook", {"url": webhook.url()}) for _ in range(4)]
    records = [await (one if i % 2 else two).process(r) for i, r in enumerate(reqs)]
    await one.close()
    await two.close()
    assert [r.outcome for r in records] == ["ok"] * 4  # the engine decided "run" four times
    assert len(webhook.requests) == 4


async def test_a_destructive_request_older_than_the_request_ttl_expires(bus: Bus, agent: KillResponder) -> None:
    runner = await ActionRunner.open(bus, make_config(engine={"request_ttl": "5m"}))
    old = make_request("kill", {}, facts=process_facts((101, "alice", "python")),
                       created_at=datetime.now(UTC) - timedelta(minutes=6))
    record = await runner.process(old)
    await runner.close()
    assert record.outcome == "expired"
    assert "engine.request_ttl" in (record.detail or "")
    assert agent.commands == []  # nothing was signalled


async def test_dry_run_executes_nothing_and_audits_everything(bus: Bus, agent: KillResponder,
                                                              webhook: FakeWebhook) -> None:
    runner = await ActionRunner.open(bus, make_config())
    kill = make_request("kill", {"grace": "60s"}, dry_run=True, facts=process_facts((101, "alice", "python")))
    hook = make_request("webhook", {"url": webhook.url()}, dry_run=True)
    engine_wide = await ActionRunner.open(bus, make_config(engine={"dry_run": True}))
    cmd = make_request("command", {"argv": ["touch", "/nonexistent/should-not-exist"]})
    records = [await runner.process(kill), await runner.process(hook), await engine_wide.process(cmd)]
    await runner.close()
    assert [r.outcome for r in records] == ["dry_run"] * 3
    assert all(r.dry_run for r in records)
    assert records[0].params["grace"] == "1m"  # validated and normalised, as it would have run
    assert agent.commands == [] and webhook.requests == []
    assert [r.outcome for r in await audit_records(bus)] == ["dry_run"] * 3


async def test_bad_parameters_are_refused_with_their_location(bus: Bus) -> None:
    runner = await ActionRunner.open(bus, make_config())
    bad = await runner.process(make_request("kill", {"signal": "TERMINATE"}))
    unknown = await runner.process(make_request("acme.nope", {}))
    wrong_kind = await runner.process(make_request("kill", {}, entity_kind="node", entity_id="n1"))
    assert bad.outcome == unknown.outcome == wrong_kind.outcome == "refused"
    assert bad.error is not None and bad.error.startswith("kill parameters: signal: Input should be 'TERM'")
    assert unknown.error is not None and unknown.error.startswith("unknown action type 'acme.nope'")
    assert wrong_kind.error == "kill acts on gpu, process, not on a node"


async def test_one_request_delivered_twice_runs_once(bus: Bus, webhook: FakeWebhook) -> None:
    runner = await ActionRunner.open(bus, make_config())
    req = make_request("webhook", {"url": webhook.url()})
    first = await runner.process(req)
    restarted = await ActionRunner.open(bus, make_config())  # a restart: same KV, new runner
    second = await restarted.process(req)
    await runner.close()
    await restarted.close()
    assert first.outcome == "ok" and second == first
    assert webhook.keys() == [req.key]
    assert len(await audit_records(bus)) == 1


async def test_two_runners_never_both_run_one_request(bus: Bus, webhook: FakeWebhook) -> None:
    runners = [await ActionRunner.open(bus, make_config(), name=f"r{i}") for i in range(2)]
    reqs = [make_request("webhook", {"url": webhook.url()}) for _ in range(5)]
    records = await asyncio.gather(*(r.process(q) for q in reqs for r in runners))
    for r in runners:
        await r.close()
    assert Counter(webhook.keys()) == Counter({q.key: 1 for q in reqs})
    assert {rec.action_key for rec in records} == {q.key for q in reqs}
    assert len(await audit_records(bus)) == 5


async def test_runners_on_the_queue_share_the_work_and_run_each_key_once(bus: Bus, webhook: FakeWebhook,
                                                                        jetstream: JetStreamContext) -> None:
    config = make_config()
    runners = [await ActionRunner.open(bus, config, name=f"q{i}", concurrency=4) for i in range(2)]
    stop = asyncio.Event()
    loops = [asyncio.create_task(r.run(stop)) for r in runners]
    reqs = [make_request("webhook", {"url": webhook.url()}) for _ in range(8)]
    for q in reqs:
        await publish_request(bus, q)
        # The same request again under another message id: a second delivery of one key.
        await bus.js_publish(S.action_subject("webhook"), q.model_dump_json().encode(), msg_id=f"again-{q.key}")
    await wait_for(lambda: len(webhook.requests) >= 8, what="8 webhook calls")
    await wait_for(lambda: consumer_idle(jetstream, runners[0].durable), what="the queue drained")
    stop.set()
    await asyncio.gather(*loops)
    for r in runners:
        await r.close()
    assert Counter(webhook.keys()) == Counter({q.key: 1 for q in reqs})
    assert sorted(r.action_key or "" for r in await audit_records(bus)) == sorted(q.key for q in reqs)


async def consumer_idle(js: JetStreamContext, durable: str) -> bool:
    info = await js.consumer_info(S.STREAM_ACTIONS, durable)
    return (info.num_pending or 0) == 0 and (info.num_ack_pending or 0) == 0


async def test_transient_failures_are_retried_through_the_queue(bus: Bus, webhook: FakeWebhook) -> None:
    webhook.statuses = [503, 502]
    runner = await ActionRunner.open(bus, make_config(), concurrency=2)
    stop = asyncio.Event()
    loop = asyncio.create_task(runner.run(stop))
    req = make_request("webhook", {"url": webhook.url()})
    await publish_request(bus, req)
    records = await wait_for(lambda: audit_records(bus), what="an audit record")
    stop.set()
    await loop
    await runner.close()
    assert [(r.outcome, r.attempt) for r in records] == [("ok", 3)]
    assert len(webhook.requests) == 3


async def test_client_errors_are_not_retried(bus: Bus, webhook: FakeWebhook) -> None:
    webhook.statuses = [404]
    runner = await ActionRunner.open(bus, make_config())
    record = await runner.process(make_request("webhook", {"url": webhook.url()}))
    await runner.close()
    assert record.outcome == "failed" and record.attempt == 1
    assert record.error is not None and "HTTP 404" in record.error
    assert len(webhook.requests) == 1


async def test_a_malformed_request_goes_to_the_dead_letter_queue(bus: Bus) -> None:
    runner = await ActionRunner.open(bus, make_config())
    stop = asyncio.Event()
    loop = asyncio.create_task(runner.run(stop))
    await bus.js_publish(S.action_subject("kill"), b'{"not": "a request"}')

    async def dead_letters() -> list[bytes]:
        return [m.data async for m in bus.replay(S.STREAM_DLQ, S.DLQ_ALL)]

    assert await wait_for(dead_letters, what="a dead letter") == [b'{"not": "a request"}']
    stop.set()
    await loop


def test_secrets_are_masked_in_the_audit() -> None:
    assert redact({"url": "u", "headers": {"Authorization": "Bearer x", "X-Team": "ml"}}) == {
        "url": "u", "headers": {"Authorization": "***", "X-Team": "ml"}}


async def test_a_permanent_failure_is_terminated_and_leaves_the_queue(bus: Bus, jetstream: JetStreamContext) -> None:
    async def garbage(msg: Message) -> bytes:
        return b"not json"

    await bus.serve(S.function_subject("broken"), garbage)
    runner = await ActionRunner.open(bus, make_config())
    stop = asyncio.Event()
    loop = asyncio.create_task(runner.run(stop))
    await publish_request(bus, make_request("function", {"name": "broken"}))
    records = await wait_for(lambda: audit_records(bus), what="an audit record")
    await wait_for(lambda: consumer_idle(jetstream, runner.durable), what="the request to leave the queue")
    stop.set()
    await loop
    assert [(r.outcome, r.attempt) for r in records] == [("failed", 1)]
    assert "answered something that is not a reply" in (records[0].error or "")
    assert (await bus.stream_info(S.STREAM_ACTIONS)).state.messages == 0


async def test_the_ledger_prunes_on_the_real_bucket(bus: Bus, webhook: FakeWebhook) -> None:
    from datetime import timedelta

    from actions.ledger import Ledger

    runner = await ActionRunner.open(bus, make_config())
    req = make_request("webhook", {"url": webhook.url()})
    record = await runner.process(req)
    await runner.close()
    ledger = Ledger(await bus.kv(), "janitor")
    assert await ledger.prune(record.time + timedelta(days=1), keep_s=7 * 86400) == 0
    assert await ledger.prune(record.time + timedelta(days=8), keep_s=7 * 86400) == 1
    assert await ledger.read(req.key) is None


async def test_a_runner_that_stops_closes_its_http_session(bus: Bus, webhook: FakeWebhook) -> None:
    """Every clean SIGTERM logged `Unclosed client session`: the runner's loop never closed what its actions
    had opened."""
    runner = await ActionRunner.open(bus, make_config())
    stop = asyncio.Event()
    loop = asyncio.create_task(runner.run(stop))
    await publish_request(bus, make_request("webhook", {"url": webhook.url()}))
    await wait_for(lambda: audit_records(bus), what="the webhook to run")
    session = runner.services.http()  # what the runner shares with its actions
    stop.set()
    await loop
    assert session.closed
