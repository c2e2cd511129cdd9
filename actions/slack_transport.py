"""How clicks reach gpuevents: Slack's Socket Mode (slack-sdk's `SocketModeClient`, an app token, no public
endpoint) and, for sites that prefer it, an HTTP interactivity endpoint that verifies Slack's request signature
and timestamp (slack-sdk's `SignatureVerifier`). Both hand the payload to one `ClickHandler`; an envelope is
acknowledged at once (Slack retries an unacknowledged one after 3 s), and the handler's KV dedupe makes a retry
or a second connection's copy a no-op.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from urllib.parse import parse_qs

import aiohttp
from aiohttp import web
from slack_sdk.signature import Clock as SlackSdkClock
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from actions.services import slack_client
from actions.slack_clicks import ClickHandler
from actions.store import KeyValue
from gpuevents.aio import guarded_task
from gpuevents.bus import Bus
from gpuevents.clock import Clock
from gpuevents.config import Config

log = logging.getLogger(__name__)

INTERACTIVITY_PATH = "/slack/interactivity"


def _web_client(config: Config) -> AsyncWebClient:
    return slack_client(config, config.actions.slack.token(), sdk_retries=True)


def click_handler(config: Config, bus: Bus, kv: KeyValue, clock: Clock, client: AsyncWebClient) -> ClickHandler:
    """A ClickHandler whose Slack calls go through `client` (and the payload's `response_url`)."""

    async def post(channel: str, text: str, blocks: list[dict[str, Any]]) -> None:
        await client.chat_postMessage(channel=channel, text=text, blocks=blocks, parse="none", link_names=False)

    async def update(channel: str, ts: str, text: str, blocks: list[dict[str, Any]]) -> None:
        await client.chat_update(channel=channel, ts=ts, text=text, blocks=blocks)

    async def ephemeral(payload: dict[str, Any], text: str) -> None:
        url = payload.get("response_url")
        if not url:
            return
        async with aiohttp.ClientSession() as session, session.post(
                url, json={"response_type": "ephemeral", "replace_original": False, "text": text}) as resp:
            await resp.read()

    async def member(channel: str, user: str) -> bool:
        cursor: str | None = None
        while True:
            resp = await client.conversations_members(channel=channel, cursor=cursor, limit=200)
            if user in (resp.get("members") or []):
                return True
            cursor = (resp.get("response_metadata") or {}).get("next_cursor") or None
            if not cursor:
                return False

    async def open_view(trigger_id: str, view: dict[str, Any]) -> None:
        await client.views_open(trigger_id=trigger_id, view=view)

    return ClickHandler(config, bus, kv, clock, post=post, update=update, ephemeral=ephemeral, member=member,
                        open_view=open_view)


async def _handle(handler: ClickHandler, payload: dict[str, Any]) -> None:
    try:
        result = await handler.handle(payload)
        log.info("Slack click: %s", result.message)
    except Exception:  # a click that fails must not end the connection
        log.exception("a Slack click could not be handled")


async def run_socket_mode(config: Config, bus: Bus, kv: KeyValue, clock: Clock, stop: asyncio.Event) -> None:
    """Receive clicks over Socket Mode until `stop` is set (slack-sdk reconnects by itself)."""
    app_token = config.actions.slack.app_token()
    assert app_token is not None, "Socket Mode needs an app token"
    web_client = _web_client(config)
    handler = click_handler(config, bus, kv, clock, web_client)
    client = SocketModeClient(app_token=app_token, web_client=web_client, ping_interval=10)
    tasks: set[asyncio.Task[None]] = set()

    async def on_request(sm: AsyncBaseSocketModeClient, req: SocketModeRequest) -> None:
        await sm.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))  # ack first
        if req.type == "interactive" and isinstance(req.payload, dict):
            task = guarded_task(_handle(handler, req.payload), "handling a Slack click")
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    client.socket_mode_request_listeners.append(on_request)
    await client.connect()
    log.info("Slack Socket Mode connected: buttons are live")
    try:
        await stop.wait()
    finally:
        await client.close()
        if tasks:
            await asyncio.wait(tasks, timeout=10)


def interactivity_app(config: Config, handler: ClickHandler, signing_secret: str, clock: Clock) -> web.Application:
    """POST /slack/interactivity: Slack's signed form post (`payload=<json>`); 401 on a bad signature or an old
    timestamp, 400 on a missing or malformed timestamp or payload, 200 at once otherwise (the click is handled
    in the background)."""
    verifier = SignatureVerifier(signing_secret, clock=_SlackClock(clock))
    tasks: set[asyncio.Task[None]] = set()

    async def interactivity(request: web.Request) -> web.Response:
        body = await request.read()
        timestamp = request.headers.get("X-Slack-Request-Timestamp", "")
        if not timestamp.isascii() or not timestamp.isdigit():  # slack-sdk's int() would raise: a 500
            return web.Response(status=400, text="X-Slack-Request-Timestamp must be a Unix time in seconds")
        if not verifier.is_valid(body, timestamp, request.headers.get("X-Slack-Signature", "")):
            return web.Response(status=401, text="invalid signature")
        try:
            payload = json.loads(parse_qs(body.decode())["payload"][0])
        except (KeyError, IndexError, ValueError, UnicodeDecodeError):
            return web.Response(status=400, text="no payload")
        task = guarded_task(_handle(handler, payload), "handling a Slack click")
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post(INTERACTIVITY_PATH, interactivity)
    return app


class _SlackClock(SlackSdkClock):
    """slack-sdk's clock interface over ours (the signature's timestamp must be within 5 minutes of now)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def now(self) -> float:
        return self.clock.now().timestamp()


async def run_interactivity_server(config: Config, bus: Bus, kv: KeyValue, clock: Clock,
                                   stop: asyncio.Event) -> None:
    secret = config.actions.slack.signing_secret()
    assert secret is not None and config.actions.slack.interactivity_port is not None
    handler = click_handler(config, bus, kv, clock, _web_client(config))
    runner = web.AppRunner(interactivity_app(config, handler, secret, clock), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "0.0.0.0", config.actions.slack.interactivity_port)
    await site.start()
    log.info("Slack interactivity endpoint on port %d%s", config.actions.slack.interactivity_port,
             INTERACTIVITY_PATH)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
