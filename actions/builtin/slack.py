"""The `slack` action's runtime: a Block Kit DM or channel post about an incident, optionally a digest per owner."""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import BaseModel, Field
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from actions import slack_format as fmt
from actions.protocol import ActionContext, ActionResult, Deferred, PermanentError, TransientError
from actions.services import slack_client
from actions.slack_clicks import SentMessage, remember
from actions.specs.slack import SlackButtons, SlackParams, SlackSpec
from actions.store import kv_key
from gpuevents.bus import KvExists, KvWrongRevision
from gpuevents.kvstate import parse_or_none
from gpuevents.records import ActionRequest

log = logging.getLogger(__name__)

DEFAULT_DIGEST_WINDOW_S = 900.0
HANDLE_CACHE_S = 3600.0
HANDLE_REFRESH_S = 60.0
NO_TOKEN_DETAIL = "printed to the console, not delivered: SLACK_BOT_TOKEN is not set"

_EMAIL = re.compile(r"^[^@\s<>]+@[^@\s<>]+\.[^@\s<>]+$")
_USER_ID = re.compile(r"^[UW][A-Z0-9]{2,}$")
_CHANNEL_ID = re.compile(r"^[CGD][A-Z0-9]{2,}$")

_warned_no_token = False


class DigestState(BaseModel):
    """One open digest in KV: the request whose redelivery sends it (`leader`), and what it holds."""

    to: str
    leader: str
    due: datetime
    closed: bool = False
    items: list[fmt.MessageItem] = Field(default_factory=list)


def _api_error(method: str, e: SlackApiError, what: str) -> Exception:
    resp = e.response
    status = getattr(resp, "status_code", 0)
    data = resp.data if isinstance(getattr(resp, "data", None), dict) else {}
    code = data.get("error", "") if isinstance(data, dict) else ""
    if status == 429 or code == "ratelimited":
        try:
            delay = float(resp.headers.get("Retry-After", resp.headers.get("retry-after", 30)))
        except (TypeError, ValueError, AttributeError):
            delay = 30.0
        return TransientError(f"Slack {method}: rate limited, retry after {delay:.0f}s", delay)
    if status >= 500:
        return TransientError(f"Slack {method}: HTTP {status}")
    if code == "users_not_found":
        return PermanentError(f"no Slack user with email {what}")
    return PermanentError(f"Slack {method} for {what}: {code or f'HTTP {status}'}")


class SlackAction(SlackSpec):
    """Per runner: one instance, holding the `@handle` cache."""

    def __init__(self) -> None:
        self._handles: dict[str, str] = {}
        self._handles_at: float | None = None
        self._handles_lock = asyncio.Lock()

    # ------------------------------------------------------------ calls
    async def _call(self, method: str, what: str, coro: Any) -> Any:
        try:
            return await coro
        except SlackApiError as e:
            raise _api_error(method, e, what) from None
        except (TimeoutError, aiohttp.ClientError) as e:
            raise TransientError(f"Slack {method}: {type(e).__name__}: {e}") from None

    async def _handle_id(self, client: AsyncWebClient, handle: str, now: float) -> str:
        async with self._handles_lock:
            fresh = self._handles_at is not None and now - self._handles_at < HANDLE_CACHE_S
            if handle in self._handles and fresh:
                return self._handles[handle]
            if not fresh or self._handles_at is None or now - self._handles_at > HANDLE_REFRESH_S:
                found: dict[str, str] = {}
                cursor: str | None = None
                while True:
                    resp = await self._call("users.list", f"@{handle}",
                                            client.users_list(cursor=cursor, limit=200))
                    for m in resp.get("members", []):
                        if m.get("deleted"):
                            continue
                        profile = m.get("profile") or {}
                        for name in (m.get("name"), profile.get("display_name")):
                            if name:
                                found.setdefault(name.lower(), m["id"])
                    cursor = (resp.get("response_metadata") or {}).get("next_cursor") or None
                    if not cursor:
                        break
                self._handles, self._handles_at = found, now
        try:
            return self._handles[handle.lower()]
        except KeyError:
            raise PermanentError(f"no Slack user @{handle}") from None

    async def resolve_channel(self, client: AsyncWebClient, to: str, now: float) -> tuple[str, str | None]:
        """Where to post: a channel as given, or the DM channel with the user `to` names (and that user's id)."""
        to = to.strip()
        if to.startswith("#") or _CHANNEL_ID.match(to):
            return to, None
        if _USER_ID.match(to):
            user = to
        elif to.startswith("@"):
            user = await self._handle_id(client, to[1:], now)
        elif _EMAIL.match(to):
            resp = await self._call("users.lookupByEmail", to, client.users_lookupByEmail(email=to))
            user = resp["user"]["id"]
        else:
            raise PermanentError(f"cannot tell who {to!r} is: use an email, a user id (U…), "
                                 "@handle or #channel")
        resp = await self._call("conversations.open", user, client.conversations_open(users=user))
        return str(resp["channel"]["id"]), user

    async def post(self, client: AsyncWebClient, to: str, text: str, blocks: list[dict[str, Any]],
                   now: float) -> ActionResult:
        channel, user = await self.resolve_channel(client, to, now)
        resp = await self._call("chat.postMessage", to, client.chat_postMessage(
            channel=channel, text=text, blocks=blocks, unfurl_links=False, unfurl_media=False,
            parse="none", link_names=False))
        return ActionResult(detail=f"sent to {to} ({channel})",
                            data={"channel": str(resp.get("channel") or channel), "ts": resp.get("ts"),
                                  "recipient": user})

    # ------------------------------------------------------------ run
    async def run(self, params: SlackParams, ctx: ActionContext) -> ActionResult:
        p = params
        req = ctx.request
        text = p.text if p.text is not None else _read_template(p.template)
        item = fmt.make_item(text, req.rule, req.entity_id, req.cluster, req.incident_id, req.facts)
        cfg = ctx.config.actions.slack
        snooze = cfg.snooze_hint if p.snooze_hint is None else p.snooze_hint
        token = cfg.token()
        buttons = p.buttons if p.buttons is not None and p.buttons.any() and not p.digest else None
        if p.digest and p.buttons is not None and p.buttons.keep:  # a digest item keeps its own incident
            item = item.model_copy(update={"request": req.model_dump(mode="json"), "buttons": list(p.buttons.keep)})
        if token is None:
            return _print_instead(p.to, item, buttons)
        client = slack_client(ctx.config, token)
        svc = ctx.services
        now = svc.clock.monotonic()
        if not p.digest:
            blocks = fmt.incident_blocks(item, snooze)
            if buttons is not None:
                blocks.append(fmt.button_block(ctx.request.key, buttons.keep, buttons.release, buttons.not_mine))
            result = await self.post(client, p.to, fmt.plain_text(item), blocks, now)
            if buttons is not None and result.data.get("ts"):
                await remember(svc.kv, SentMessage(
                    request=ctx.request, channel=result.data["channel"], ts=str(result.data["ts"]),
                    recipient=result.data.get("recipient"), blocks=blocks, text=fmt.plain_text(item)))
            return result
        window = p.digest_window or cfg.digest_window or DEFAULT_DIGEST_WINDOW_S
        items = await _join_digest(ctx, p.to, item, window)
        if items is None:
            return ActionResult(detail=f"queued in the digest for {p.to}")
        summary = f"{len(items)} GPU incident{'s' if len(items) != 1 else ''}: " + "; ".join(
            i.text for i in items[:5])
        blocks = fmt.digest_blocks(items, window, snooze, ctx.config.costs.currency)
        result = await self.post(client, p.to, fmt.truncate(summary), blocks, now)
        if result.data.get("ts"):
            for i in items:
                if i.request and i.buttons:
                    await remember(svc.kv, SentMessage(
                        request=ActionRequest.model_validate(i.request), channel=result.data["channel"],
                        ts=str(result.data["ts"]), recipient=result.data.get("recipient"), blocks=blocks,
                        text=i.text))
        return result.model_copy(update={"detail": f"digest of {len(items)} sent to {p.to}"})


def _read_template(path: str | None) -> str:
    assert path is not None
    try:
        return Path(path).read_text()
    except OSError as e:
        raise PermanentError(f"template {path}: {e.strerror}") from None


def _print_instead(to: str, item: fmt.MessageItem, buttons: SlackButtons | None = None) -> ActionResult:
    """The demo path: no token, so the message goes to the console (with the buttons it would show, and the
    command that does what each does); warn once per process. Printing is not delivery (DESIGN §3.4): the run
    ends `refused`, so a destructive action staged after this warning is refused too."""
    global _warned_no_token
    if not _warned_no_token:
        _warned_no_token = True
        log.warning("SLACK_BOT_TOKEN is not set: Slack messages are printed to the console instead of sent")
    sys.stdout.write(f"[slack → {to}] {fmt.plain_text(item)}\n")
    if buttons is not None:
        shown = fmt.buttons_text(item, buttons.keep, buttons.release, buttons.not_mine)
        sys.stdout.write(f"[slack → {to}]   buttons: {shown}\n")
    sys.stdout.flush()
    return ActionResult(status="refused", detail=NO_TOKEN_DETAIL)


async def _join_digest(ctx: ActionContext, to: str, item: fmt.MessageItem,
                       window: float) -> list[fmt.MessageItem] | None:
    """Add `item` to `to`'s open digest. The first request of a window leads: it is deferred until
    the window closes, then returns every item to send. Others return None (queued)."""
    svc = ctx.services
    key = kv_key("actions", "slack", "digest", to)
    me = ctx.request.key
    for _ in range(32):
        now = svc.clock.now()
        got = await svc.kv.get(key)
        state = None if got is None else parse_or_none(DigestState, got, "it is written over")
        revision = 0 if got is None else got.revision
        if state is not None and state.leader == me:
            if not state.closed and now < state.due - timedelta(milliseconds=50):
                raise Deferred((state.due - now).total_seconds(), f"digest for {to} sends at {state.due}")
            closed = state.model_copy(update={"closed": True})
            if not state.closed:
                try:
                    await svc.kv.update(key, closed.model_dump_json().encode(), last=revision)
                except KvWrongRevision:
                    continue
            return closed.items
        stale = state is not None and now > state.due + timedelta(seconds=window + 60)
        if state is None or state.closed or stale:
            carried = state.items if state is not None and stale and not state.closed else []
            new = DigestState(to=to, leader=me, due=now if carried else now + timedelta(seconds=window),
                              items=[*_without(carried, item), item])
            try:
                if got is None:
                    await svc.kv.create(key, new.model_dump_json().encode())
                else:
                    await svc.kv.update(key, new.model_dump_json().encode(), last=revision)
            except (KvExists, KvWrongRevision):
                continue
            continue  # now the leader: the loop defers (or sends a stale digest at once)
        grown = state.model_copy(update={"items": [*_without(state.items, item), item]})
        try:
            await svc.kv.update(key, grown.model_dump_json().encode(), last=revision)
        except KvWrongRevision:
            continue
        return None
    raise TransientError(f"the digest for {to} keeps changing; trying again later")


def _without(items: list[fmt.MessageItem], item: fmt.MessageItem) -> list[fmt.MessageItem]:
    return [i for i in items if (i.rule, i.entity_id, i.incident_id) != (item.rule, item.entity_id, item.incident_id)]

