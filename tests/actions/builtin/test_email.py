"""The email action through aiosmtplib against a real local SMTP server (aiosmtpd)."""

from __future__ import annotations

import email
from collections.abc import Iterator
from email.message import Message
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from actions.escaping import UnsafeValue
from actions.registry import escape_for
from actions.runner import ActionRunner
from gpuevents.server import free_port
from rules.lang.templates import compile_params, render_params
from tests.actions.conftest import make_config, make_request


class Inbox:
    """aiosmtpd handler: keeps every message; answers RCPT for `refuse` with 550."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], Message]] = []
        self.refuse: set[str] = set()

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:
        if address in self.refuse:
            return "550 no such user here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append((list(envelope.rcpt_tos), email.message_from_bytes(envelope.content)))
        return "250 Message accepted for delivery"


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


def email_config(port: int, **extra: object) -> dict[str, object]:
    return {"email": {"host": "127.0.0.1", "port": port, "sender": "gpuevents@hpc.example.org", **extra}}


async def test_a_mail_reaches_the_smtp_server_with_subject_and_body(smtp: tuple[Inbox, int]) -> None:
    inbox, port = smtp
    runner = await ActionRunner.open(None, make_config(actions=email_config(port)))
    record = await runner.process(make_request("email", {"to": "alice@hpc.example.org", "subject": "Job 42 idle",
                                                         "text": "Your job 42 has held 4 idle GPUs for 1h.\n"}))
    assert record.outcome == "ok" and record.detail == "mailed alice@hpc.example.org"
    [(rcpts, msg)] = inbox.messages
    assert rcpts == ["alice@hpc.example.org"]
    assert msg["From"] == "gpuevents@hpc.example.org" and msg["Subject"] == "Job 42 idle"
    payload = msg.get_payload()
    assert isinstance(payload, str) and payload.strip() == "Your job 42 has held 4 idle GPUs for 1h."


async def test_a_user_name_is_mailed_at_the_default_domain(smtp: tuple[Inbox, int]) -> None:
    inbox, port = smtp
    runner = await ActionRunner.open(None, make_config(actions=email_config(port, default_domain="hpc.example.org")))
    record = await runner.process(make_request("email", {"to": "bob", "subject": "s", "text": "t"}))
    assert record.outcome == "ok" and inbox.messages[0][0] == ["bob@hpc.example.org"]


async def test_a_refused_recipient_fails_without_retrying(smtp: tuple[Inbox, int]) -> None:
    inbox, port = smtp
    inbox.refuse.add("ghost@hpc.example.org")
    runner = await ActionRunner.open(None, make_config(actions=email_config(port)))
    record = await runner.process(make_request("email", {"to": "ghost@hpc.example.org", "subject": "s", "text": "t"}))
    assert record.outcome == "failed" and record.attempt == 1 and "refused" in (record.error or "")
    assert inbox.messages == []


async def test_no_smtp_server_is_retried_then_fails() -> None:
    runner = await ActionRunner.open(None, make_config(actions={**email_config(free_port()),
                                                                "retry": {"max_attempts": 2, "backoff": 0.05}}))
    record = await runner.process(make_request("email", {"to": "a@b.org", "subject": "s", "text": "t"}))
    assert record.outcome == "failed" and record.attempt == 2


def test_machine_values_cannot_add_recipients_or_headers() -> None:
    tree, errors = compile_params({"to": "{{ process.user }}", "subject": "{{ process.name }} idle", "text": "x"},
                                  "process", escape_for("email"))
    assert errors == []
    out = render_params(tree, {"process": {"user": "alice", "name": "a\r\nBcc: everyone@x.org"}})
    assert out["subject"] == "a Bcc: everyone@x.org idle"
    with pytest.raises(UnsafeValue, match="not one email address"):
        render_params(tree, {"process": {"user": "alice@x.org, bob@y.org", "name": "n"}})
