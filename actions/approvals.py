"""Approvals (DESIGN §3.4): a destructive action with `approve: "#channel"` runs only once someone approves it.

The first runner to see the request posts it to the channel with Approve / Deny buttons and keeps its state in KV
(`pending`, created once); the request is redelivered every few seconds until the state says `approved` (then
it runs: the request's age counts from the approval), `denied` (refused, with who denied it) or its
`approve_within` passed (`expired`). Without a Slack token the question is printed and can only expire.

Requests with the same `approval_key` share one question and one answer: the destructive actions a fleet-share
limit holds in one outbreak (rules/core/sends.py) are posted once, with what is held and why, and one release
lets them all run.
"""

from __future__ import annotations

import logging
import sys
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel

from actions.services import slack_client
from actions.slack_format import md
from actions.store import KeyValue, kv_key
from gpuevents.bus import KvExists
from gpuevents.config import Config
from gpuevents.durations import format_duration
from gpuevents.kvstate import parse_or_none
from gpuevents.records import ActionRequest

log = logging.getLogger(__name__)

APPROVE = "gpuevents_approve"
DENY = "gpuevents_deny"
RECHECK_S = 5.0


class Approval(BaseModel):
    status: Literal["pending", "approved", "denied"] = "pending"
    channel: str = ""
    ts: str = ""
    by: str = ""
    at: datetime | None = None
    request: ActionRequest


def approval_key(request_key: str) -> str:
    return kv_key("actions", "approval", request_key)


def shared_key(req: ActionRequest) -> str:
    """The key of the request's approval: its own, or the one it shares (an outbreak's hold)."""
    return req.approval_key or req.key


def question(req: ActionRequest) -> str:
    if req.approval_key:
        return (f"The fleet-share limit of rule `{req.rule}` holds its `{req.type}` actions: {req.reason or ''}. "
                f"Release them for this outbreak (from {req.entity_id} on)? Unanswered, they expire in "
                f"{format_duration(req.approve_within)}.")
    reason = req.params.get("reason") or ""
    return (f"Approve `{req.type}` on {req.entity_id} (rule `{req.rule}`)?" + (f" {reason}" if reason else "")
            + f" Unanswered, it expires in {format_duration(req.approve_within)}.")


def approval_blocks(req: ActionRequest) -> list[dict[str, Any]]:
    def button(text: str, action_id: str, style: str) -> dict[str, Any]:
        return {"type": "button", "text": {"type": "plain_text", "text": text}, "action_id": action_id,
                "value": shared_key(req), "style": style}

    return [{"type": "section", "text": md(question(req))},
            {"type": "actions", "block_id": "gpuevents_approval",
             "elements": [button("Approve", APPROVE, "primary"), button("Deny", DENY, "danger")]}]


async def gate(req: ActionRequest, kv: KeyValue, config: Config, now: datetime) -> tuple[str, str]:
    """Where the request's approval stands: ("approved", when), ("denied", by whom), ("expired", why), or
    ("pending", seconds to look again) — posting the question the first time."""
    key = approval_key(shared_key(req))
    got = await kv.get(key)
    if got is not None and parse_or_none(Approval, got, "deleting it: the approval is asked again") is None:
        await kv.delete(got.key)
        got = None
    if got is None:
        state = Approval(request=req)
        try:
            await kv.create(key, state.model_dump_json().encode())
        except KvExists:
            return "pending", str(RECHECK_S)  # another runner posts it
        await _post(req, kv, config, state)
        return "pending", str(RECHECK_S)
    state = Approval.model_validate_json(got.value)
    if state.status == "approved":
        return "approved", (state.at or now).isoformat()
    if state.status == "denied":
        return "denied", state.by
    deadline = req.created_at + timedelta(seconds=req.approve_within)
    if now >= deadline:
        return "expired", f"no approval from {req.approve} within {format_duration(req.approve_within)}"
    return "pending", str(min(RECHECK_S, (deadline - now).total_seconds()))


async def _post(req: ActionRequest, kv: KeyValue, config: Config, state: Approval) -> None:
    cfg = config.actions.slack
    token = cfg.token()
    if token is None:
        sys.stdout.write(f"[approval → {req.approve}] {question(req)} (no SLACK_BOT_TOKEN: nobody can answer)\n")
        return
    client = slack_client(config, token, sdk_retries=True)
    resp = await client.chat_postMessage(channel=str(req.approve), text=question(req), blocks=approval_blocks(req),
                                         parse="none", link_names=False)
    posted = state.model_copy(update={"channel": str(resp.get("channel") or req.approve), "ts": str(resp.get("ts"))})
    await kv.put(approval_key(shared_key(req)), posted.model_dump_json().encode())


async def decide(kv: KeyValue, request_key: str, approved: bool, by: str, now: datetime) -> Approval | None:
    """Record an answer (the first one wins); the approval as it now stands, or None when unknown."""
    got = await kv.get(approval_key(request_key))
    state = None if got is None else parse_or_none(Approval, got, "the answer is not recorded")
    if state is None:
        return None
    if state.status != "pending":
        return state
    answered = state.model_copy(update={"status": "approved" if approved else "denied", "by": by, "at": now})
    await kv.put(approval_key(request_key), answered.model_dump_json().encode())
    return answered
