"""The publish action on a real nats-server: data chained onto a subject, stored once per key on an event
subject, reserved and command subjects refused at load and at run time."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from actions.runner import ActionRunner
from actions.specs.publish import PublishParams
from gpuevents import subjects as S
from gpuevents.bus import Bus, Message
from gpuevents.yamlpos import LocatedError
from rules.lang.loader import load_rule_set
from tests.actions.conftest import make_config, make_request
from tests.waiting import wait_for


async def test_publish_chains_data_onto_a_subject(bus: Bus) -> None:
    got: list[bytes] = []

    async def on_msg(msg: Message) -> None:
        got.append(msg.data)

    await bus.subscribe("team.ml.gpu-idle", on_msg)
    runner = await ActionRunner.open(bus, make_config())
    record = await runner.process(make_request("publish", {"subject": "team.ml.gpu-idle",
                                                           "data": {"gpu": "n1/gpu0", "hours": 2}}))
    assert record.outcome == "ok"
    assert orjson.loads((await wait_for(lambda: got, what="the published message"))[0]) == {
        "gpu": "n1/gpu0", "hours": 2}


async def test_publish_to_an_event_subject_is_stored_once_per_key(bus: Bus) -> None:
    subject = S.event_subject("default", "n1", "gpu.idle")
    req = make_request("publish", {"subject": subject, "data": {"chained": True}})
    first = await (await ActionRunner.open(bus, make_config())).process(req)
    # The same request again (a redelivery after a lost ack) through another runner on the bus.
    again = await (await ActionRunner.open(bus, make_config())).process(req)
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
    record = await (await ActionRunner.open(bus, make_config())).process(
        make_request("publish", {"subject": "gpuevents.act.kill", "data": {}}))
    assert record.outcome == "refused" and "is reserved" in (record.error or "")
