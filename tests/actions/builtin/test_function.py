"""The function action on a real nats-server: the incident sent, the reply is the outcome, nobody serving is
retried then failed."""

from __future__ import annotations

import orjson

from actions.runner import ActionRunner
from gpuevents import subjects as S
from gpuevents.bus import Bus, Message
from tests.actions.conftest import make_config, make_request


async def test_function_gets_the_incident_and_its_reply_is_the_outcome(bus: Bus) -> None:
    seen: list[dict[str, object]] = []

    async def triage(msg: Message) -> bytes:
        seen.append(orjson.loads(msg.data))
        return b'{"status": "refused", "detail": "job is on the allow list"}'

    await bus.serve(S.function_subject("acme.triage"), triage)
    runner = await ActionRunner.open(bus, make_config())
    req = make_request("function", {"name": "acme.triage", "data": {"team": "ml"}})
    record = await runner.process(req)
    assert (record.outcome, record.error) == ("refused", "job is on the allow list")
    assert seen[0]["rule"] == req.rule and seen[0]["key"] == req.key and seen[0]["data"] == {"team": "ml"}


async def test_function_that_nobody_serves_is_retried_then_fails(bus: Bus) -> None:
    record = await (await ActionRunner.open(bus, make_config())).process(make_request("function", {"name": "missing"}))
    assert record.outcome == "failed" and "no function answers on gpuevents.fn.missing" in (record.error or "")
