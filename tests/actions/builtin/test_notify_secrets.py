"""No notify service's secret reaches an action's error, the audit or a log line when a post fails: Apprise names
the target in its warnings (PagerDuty's API key, for one), and the action cuts every secret of the URL out.

One case per service docs/actions.md lists, each failing for real: a local server that answers 500 (reached
through the CONNECT proxy for the services Apprise sends to their own hosts), an SMTP server that offers no login.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from actions.builtin.notify import redact, url_secrets
from actions.runner import ActionRunner
from gpuevents.server import free_port
from tests.actions.builtin.test_notify import notify_config, plain, proxy, tls  # noqa: F401  (fixtures)
from tests.actions.conftest import make_request
from tests.actions.notify_servers import ConnectProxy, WebhookServices

S1, S2, S3 = "SECRETalphaQ1", "SECRETbravoQ2", "SECRETcharlieQ3"


class _Refuse:
    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        return "554 no"


@pytest.fixture
def smtp_port() -> Iterator[int]:
    port = free_port()
    controller = Controller(_Refuse(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port
    finally:
        controller.stop()


URLS: dict[str, Callable[[int], str]] = {
    "pagerduty": lambda _p: f"pagerduty://{S1}@{S2}?verify=no",
    "discord": lambda _p: f"discord://{S1}/{S2}?verify=no",
    "gchat": lambda _p: f"gchat://{S1}/{S2}/{S3}?verify=no",
    "opsgenie": lambda _p: f"opsgenie://{S1}/@alice?verify=no",
    "teams": lambda p: f"workflows://127.0.0.1:{p}/{S1}/{S2}?verify=no",
    "mattermost": lambda p: f"mmost://127.0.0.1:{p}/{S1}",
    "json": lambda p: f"json://user:{S1}@127.0.0.1:{p}/hook/{S2}",
}
THROUGH_PROXY = {"pagerduty", "discord", "gchat", "opsgenie"}


def _assert_clean(text: str) -> None:
    for secret in (S1, S2, S3):
        assert secret not in text


async def _fail(url: str, caplog: pytest.LogCaptureFixture) -> str:
    caplog.set_level(logging.DEBUG)
    config = notify_config({"svc": {"url": url}}, max_attempts=1)
    record = await (await ActionRunner.open(None, config)).process(make_request("notify", {"to": "svc", "text": "x"}))
    assert record.outcome == "failed"
    assert record.error
    _assert_clean(record.model_dump_json())
    # every log line of this process but the local service's own access log (the service sees its URL)
    _assert_clean("\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("aiohttp.access")))
    return record.error


@pytest.mark.parametrize("service", sorted(URLS))
async def test_a_failed_post_shows_no_secret_of_the_services_url(
        service: str, plain: WebhookServices, tls: WebhookServices,  # noqa: F811
        proxy: ConnectProxy, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    server = tls if service in THROUGH_PROXY or service == "teams" else plain
    server.statuses = [500] * 4
    error = await _fail(URLS[service](server.port), caplog)
    assert "500" in error or "error" in error.lower()
    assert server.posts, "the post reached the local service and failed there"


async def test_a_failed_mail_shows_no_password(smtp_port: int, caplog: pytest.LogCaptureFixture) -> None:
    await _fail(f"mailto://gpu:{S1}@127.0.0.1:{smtp_port}?to=a@hpc.example.org&secure=no", caplog)


async def test_a_url_apprise_cannot_read_shows_nothing_but_its_scheme(caplog: pytest.LogCaptureFixture) -> None:
    error = await _fail(f"nosuch://{S1}@{S2}/{S3}", caplog)
    assert "does not know" in error


def test_redaction_keeps_what_the_privacy_form_shows() -> None:
    secrets = url_secrets(f"mmosts://chat.example.org/{S1}?channel=%23gpu", "mmosts://chat.example.org/S...1/")
    assert redact(f"posting to chat.example.org with {S1}", secrets) == "posting to chat.example.org with …"
