"""What a click on a gpuevents Slack message does (DESIGN §5.1), whatever brought it (Socket Mode or HTTP).

The `slack` action stores each message it sent with buttons (`SentMessage`, in KV under its request key); a
button's value is that key. A click is handled once (a KV create on the click's own id: Slack retries and a
second connection deliver it again), only from the message's recipient or `actions.slack.admins` (anyone else
gets an ephemeral refusal), then:

- `keep_<seconds>`: opens the Keep form (actions/slack_keep.py: why, and for how long); its submission sends the
  keep, with its reason, to the acting engine (the same request as `gpuevents keep`, gpuevents/wire), which keeps
  it up to the rule's `snooze_max` and asks the rule's approving channel for longer; the staged actions not yet
  run are cancelled with the incident;
- `release`: a `kill` request through GPUEVENTS_ACT, with the original request's facts, so the runner and the
  agent make the same checks (identity, protection, audit) as for a rule's kill;
- `not_mine`: the message is posted to `actions.slack.escalation_channel`.

The message is then updated in place to say what was done and by whom, and the click is audited.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, Field

from actions.approvals import APPROVE, DENY, Approval, approval_key, decide, question
from actions.slack_format import KEEP_PREFIX, NOT_MINE, RELEASE
from actions.slack_keep import KeepFormError, form_key, keep_choices, keep_view, read_form
from actions.store import KeyValue, kv_key
from gpuevents import subjects as S
from gpuevents.bus import Bus, BusError, BusNoResponders, BusTimeout, KvExists
from gpuevents.clock import Clock
from gpuevents.config import Config
from gpuevents.kvstate import parse_or_none
from gpuevents.records import ActionRequest, AuditRecord
from gpuevents.wire import KeepReply, NoEngine, keep_request

log = logging.getLogger(__name__)



class SentMessage(BaseModel):
    """A message with buttons as it was sent: who it was for, where it is, and the request it came from."""

    request: ActionRequest
    channel: str
    ts: str
    recipient: str | None = None
    """The Slack user id it was sent to (a DM), who may click; None for a channel post (admins only)."""
    blocks: list[dict[str, Any]] = Field(default_factory=list)
    text: str = ""


def sent_key(request_key: str) -> str:
    return kv_key("actions", "slack", "sent", request_key)


async def remember(kv: KeyValue, sent: SentMessage) -> None:
    await kv.put(sent_key(sent.request.key), sent.model_dump_json().encode())


class ClickResult(BaseModel):
    done: bool
    message: str
    duplicate: bool = False


SlackCall = Callable[..., Awaitable[Any]]


class ClickHandler:
    """Turns a `block_actions` payload into what its button means, and a Keep form's `view_submission` into a keep.
    `post`/`update`/`ephemeral`/`open_view` are the Slack calls (chat.postMessage, chat.update, the payload's
    response_url, views.open), injected by the transport."""

    def __init__(self, config: Config, bus: Bus, kv: KeyValue, clock: Clock, *, post: SlackCall, update: SlackCall,
                 ephemeral: SlackCall, member: SlackCall | None = None, open_view: SlackCall | None = None) -> None:
        self.config = config
        self.bus = bus
        self.kv = kv
        self.clock = clock
        self.post = post
        self.update = update
        self.ephemeral = ephemeral
        self.member = member or _nobody
        self.open_view = open_view

    async def handle(self, payload: dict[str, Any]) -> ClickResult:
        if payload.get("type") == "view_submission":
            return await self._submitted(payload)
        actions = payload.get("actions") or []
        if payload.get("type") != "block_actions" or not actions:
            return ClickResult(done=False, message="not a button click")
        action = actions[0]
        action_id = str(action.get("action_id", ""))
        clicker = str((payload.get("user") or {}).get("id", ""))
        click_id = f"{action.get('action_ts', '')}|{action_id}|{clicker}"
        try:
            await self.kv.create(kv_key("actions", "slack", "click", click_id), b"1")
        except KvExists:
            return ClickResult(done=False, message="already handled", duplicate=True)
        if action_id in (APPROVE, DENY):
            return await self._answer(payload, str(action.get("value", "")), action_id == APPROVE, clicker)
        sent, refused = await self._message(payload, str(action.get("value", "")), clicker, action_id)
        if sent is None:
            return refused
        if action_id.startswith(KEEP_PREFIX):
            return await self._open_form(payload, sent, float(action_id[len(KEEP_PREFIX):]))
        if action_id == RELEASE:
            said = await self._release(sent, clicker)
        elif action_id == NOT_MINE:
            said = await self._not_mine(sent, clicker)
        else:
            return ClickResult(done=False, message=f"unknown button {action_id}")
        await self.update(sent.channel, sent.ts, said, _answered(sent.blocks, said))
        await self._audit(sent, f"{action_id} by {clicker}: {said}")
        return ClickResult(done=True, message=said)

    async def _message(self, payload: dict[str, Any], key: str, clicker: str,
                       what: str) -> tuple[SentMessage | None, ClickResult]:
        """The tracked message `key` names, if `clicker` may answer it (its recipient or an admin); else None, and
        the refusal they were shown."""
        got = await self.kv.get(sent_key(key))
        sent = None if got is None else parse_or_none(SentMessage, got, "the click is answered as untracked")
        if sent is None:
            await self.ephemeral(payload, "This message is no longer tracked by gpuevents.")
            return None, ClickResult(done=False, message="unknown message")
        if clicker != sent.recipient and clicker not in set(self.config.actions.slack.admins):
            who = f"<@{sent.recipient}>" if sent.recipient else "an admin"
            await self.ephemeral(payload, f"Only {who} (or an admin) can answer this message.")
            await self._audit(sent, f"{what} refused: clicked by {clicker}, not the recipient")
            return None, ClickResult(done=False, message="not the recipient")
        return sent, ClickResult(done=False, message="")

    async def _open_form(self, payload: dict[str, Any], sent: SentMessage, seconds: float) -> ClickResult:
        """A Keep click asks why first: the Keep form, opened with the click's trigger_id."""
        trigger = payload.get("trigger_id")
        if self.open_view is None or not trigger:
            await self.ephemeral(payload, "The Keep form could not be opened: click Keep again.")
            return ClickResult(done=False, message="no trigger_id to open the Keep form with")
        what = f"Keep {sent.request.entity_id} from rule `{sent.request.rule}`"
        await self.open_view(trigger, keep_view(sent.request.key, seconds, keep_choices(sent.blocks), what))
        return ClickResult(done=True, message="Keep form opened")

    async def _submitted(self, payload: dict[str, Any]) -> ClickResult:
        """A submitted Keep form: the keep, with its reason, as `gpuevents keep --reason` sends it."""
        view = payload.get("view") or {}
        clicker = str((payload.get("user") or {}).get("id", ""))
        try:
            await self.kv.create(kv_key("actions", "slack", "click", f"view|{view.get('id', '')}|{clicker}"), b"1")
        except KvExists:
            return ClickResult(done=False, message="already handled", duplicate=True)
        key = form_key(view)
        sent, refused = await self._message(payload, key, clicker, "keep")
        if sent is None:
            return refused
        try:
            form = read_form(view, keep_choices(sent.blocks))
        except KeepFormError as e:
            await self._audit(sent, f"keep refused: {e}")
            return ClickResult(done=False, message=str(e))
        said = await self._keep(sent, clicker, form.seconds, form.reason)
        await self.update(sent.channel, sent.ts, said, _answered(sent.blocks, said))
        await self._audit(sent, f"keep by {clicker} ({form.reason}): {said}")
        return ClickResult(done=True, message=said)

    async def _answer(self, payload: dict[str, Any], request_key: str, approved: bool, clicker: str) -> ClickResult:
        """Approve or Deny on an approval request: a member of its channel or an admin may answer, once."""
        got = await self.kv.get(approval_key(request_key))
        state = None if got is None else parse_or_none(Approval, got, "the click is answered as untracked")
        if state is None:
            await self.ephemeral(payload, "This approval is no longer tracked by gpuevents.")
            return ClickResult(done=False, message="unknown approval")
        if clicker not in self.config.actions.slack.admins and not await self.member(state.channel, clicker):
            await self.ephemeral(payload, f"Only a member of {state.request.approve} (or an admin) can answer.")
            return ClickResult(done=False, message="not a member of the approving channel")
        answered = await decide(self.kv, request_key, approved, clicker, self.clock.now())
        assert answered is not None
        verb = "approved" if answered.status == "approved" else "denied"
        said = f"{verb} by <@{answered.by}>" if answered.by == clicker else f"already {verb} by <@{answered.by}>"
        blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": question(state.request), "verbatim": True}}]
        await self.update(state.channel, state.ts, said, _answered(blocks, said))
        req = state.request
        await self._audit(SentMessage(request=req, channel=state.channel, ts=state.ts),
                          f"{req.type} {verb} by {clicker}")
        if answered.by == clicker and req.type == "keep":
            await self._tell_keeper(req, answered.status == "approved", clicker)
        return ClickResult(done=True, message=said)

    async def _tell_keeper(self, req: ActionRequest, approved: bool, clicker: str) -> None:
        """The owner who asked for a keep past snooze_max from Slack hears the answer (a terminal's asker reads
        `gpuevents audit`)."""
        by = str(req.params.get("by", ""))
        if not by.startswith("slack:"):
            return
        until = str(req.params.get("until", ""))[:16].replace("T", " ")
        text = (f"Your keep of {req.entity_id} (rule `{req.rule}`) until {until} UTC was approved by <@{clicker}>."
                if approved else
                f"Your keep of {req.entity_id} (rule `{req.rule}`) until {until} UTC was denied by <@{clicker}>: "
                "it stays kept for the rule's snooze_max.")
        await self.post(by.removeprefix("slack:"), text, [])

    async def _keep(self, sent: SentMessage, clicker: str, seconds: float, reason: str) -> str:
        req = sent.request
        ask = keep_request(req.rule, req.entity_id, seconds, self.clock.now(), f"slack:{clicker}", reason, keep=True)
        try:
            raw = await self.bus.request(S.ENGINE_SNOOZE, ask.model_dump_json().encode(), timeout=5)
        except (BusNoResponders, BusTimeout) as e:
            return f"not kept: {NoEngine(f'{req.entity_id} was not kept', str(e) or type(e).__name__)}"
        reply = KeepReply.model_validate_json(raw)
        if reply.ok and reply.over_budget is not None:
            return f"not kept yet: {reply.note(seconds)}"
        if not reply.ok or reply.until is None:
            return f"not kept: {reply.error}"
        note = reply.note(seconds, lambda u: f"<@{u}>")
        return f"kept until {reply.until:%Y-%m-%d %H:%M} UTC by <@{clicker}>" + (f" ({note})" if note else "")

    async def _release(self, sent: SentMessage, clicker: str) -> str:
        req = sent.request
        action_type = "kill"  # the processes of the GPU (or the process): the same checks as a rule's kill
        params: dict[str, Any] = {"type": action_type, "signal": "TERM", "grace": 30,
                                  "reason": f"released by its owner in Slack ({clicker})"}
        release = ActionRequest(
            key=f"{req.incident_id}:release:{sent.ts}", type=action_type, params=params, rule=req.rule,
            rule_labels=req.rule_labels, entity_id=req.entity_id, entity_kind=req.entity_kind, cluster=req.cluster,
            node=req.node, incident_id=req.incident_id, phase="fire", index=0, repeat=0, destructive=True,
            facts=req.facts, created_at=self.clock.now(),
        )
        await self.bus.js_publish(S.action_subject(action_type), release.model_dump_json().encode(), msg_id=release.key)
        pids = ", ".join(str(p.pid) for p in req.facts.processes)
        what = f"pid {pids}" if pids else req.entity_id
        return f"released by <@{clicker}>: ending {what} ({action_type})"

    async def _not_mine(self, sent: SentMessage, clicker: str) -> str:
        channel = self.config.actions.slack.escalation_channel
        if not channel:
            return f"<@{clicker}> says this is not theirs (no actions.slack.escalation_channel is set)"
        await self.post(channel, f"<@{clicker}> says this is not theirs: {sent.text}", sent.blocks[:2])
        return f"passed to {channel} by <@{clicker}>: not theirs"

    async def _audit(self, sent: SentMessage, detail: str) -> None:
        req = sent.request
        record = AuditRecord(time=self.clock.now(), kind="click", rule=req.rule, entity_id=req.entity_id,
                             incident_id=req.incident_id, detail=detail)
        try:
            await self.bus.js_publish(S.audit_subject(req.rule), record.model_dump_json().encode(), msg_id=record.id)
        except BusError as e:
            log.warning("a Slack click could not be audited: %s", e)


async def _nobody(channel: str, user: str) -> bool:
    return False


def _answered(blocks: list[dict[str, Any]], said: str) -> list[dict[str, Any]]:
    """The message without its buttons, with what was done."""
    kept = [b for b in blocks if b.get("type") != "actions"]
    return [*kept, {"type": "context", "elements": [{"type": "mrkdwn", "text": said, "verbatim": True}]}]

