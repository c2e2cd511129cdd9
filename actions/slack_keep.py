"""The Keep form (DESIGN §5.1): a Keep button opens a Slack modal (views.open with the click's trigger_id) asking
why and for how long; its `view_submission` carries both back. The form knows which message it answers by its
`private_metadata` (the message's request key), and offers the durations of that message's Keep buttons."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from actions.slack_format import KEEP_PREFIX, keep_label
from gpuevents.wire.keeps import REASON_MAX

KEEP_FORM = "gpuevents_keep_form"
"""The modal's callback_id."""
REASON_BLOCK = "reason"
FOR_BLOCK = "for"


class KeepForm(BaseModel):
    """What a submitted form says: the message (its request key), how long, and why."""

    key: str
    seconds: float
    reason: str


class KeepFormError(ValueError):
    """A submission that is not one of our forms, or was altered (a duration the message did not offer)."""


def keep_choices(blocks: list[dict[str, Any]]) -> list[float]:
    """The durations of a message's Keep buttons, in their order."""
    out: list[float] = []
    for b in blocks:
        if b.get("type") == "actions":
            for e in b.get("elements") or []:
                action_id = str(e.get("action_id", ""))
                if action_id.startswith(KEEP_PREFIX):
                    out.append(float(action_id[len(KEEP_PREFIX):]))
    return out


def _option(seconds: float) -> dict[str, Any]:
    return {"text": {"type": "plain_text", "text": keep_label(seconds)}, "value": str(int(seconds))}


def keep_view(request_key: str, clicked: float, choices: list[float], what: str) -> dict[str, Any]:
    """The modal a Keep click opens: the reason (required) and the duration, the clicked one chosen."""
    options = [_option(s) for s in (choices or [clicked])]
    initial = next((o for o in options if o["value"] == str(int(clicked))), options[0])
    return {
        "type": "modal", "callback_id": KEEP_FORM,
        "private_metadata": json.dumps({"key": request_key}),
        "title": {"type": "plain_text", "text": "Keep it"},
        "submit": {"type": "plain_text", "text": "Keep"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": what, "verbatim": True}},
            {"type": "input", "block_id": REASON_BLOCK, "label": {"type": "plain_text", "text": "Why must it stay?"},
             "element": {"type": "plain_text_input", "action_id": REASON_BLOCK, "multiline": True,
                         "max_length": REASON_MAX, "min_length": 3}},
            {"type": "input", "block_id": FOR_BLOCK, "label": {"type": "plain_text", "text": "For how long"},
             "element": {"type": "static_select", "action_id": FOR_BLOCK, "options": options,
                         "initial_option": initial}},
        ],
    }


def form_key(view: dict[str, Any]) -> str:
    """The request key a Keep form's `private_metadata` names ("" when it names none)."""
    try:
        return str(json.loads(view.get("private_metadata") or "{}").get("key", ""))
    except (ValueError, AttributeError):
        return ""


def read_form(view: dict[str, Any], offered: list[float]) -> KeepForm:
    """The submitted form's answer; KeepFormError when it is not our form or its duration was not offered."""
    if view.get("callback_id") != KEEP_FORM:
        raise KeepFormError(f"not a Keep form: {view.get('callback_id')!r}")
    values = (view.get("state") or {}).get("values") or {}
    key = form_key(view)
    try:
        reason = str(values[REASON_BLOCK][REASON_BLOCK]["value"] or "").strip()
        chosen = float(values[FOR_BLOCK][FOR_BLOCK]["selected_option"]["value"])
    except (KeyError, TypeError, ValueError) as e:
        raise KeepFormError(f"the Keep form is incomplete or altered ({e})") from None
    if not key:
        raise KeepFormError("the Keep form names no message")
    if chosen not in offered:
        raise KeepFormError(f"{int(chosen)}s is not one of the message's Keep durations")
    try:
        return KeepForm(key=key, seconds=chosen, reason=reason)
    except ValidationError as e:
        raise KeepFormError(str(e)) from None
