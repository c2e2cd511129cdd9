"""The Keep form: the modal a Keep click opens, and what a submission may say (an altered one is refused)."""

from __future__ import annotations

from typing import Any

import pytest

from actions.slack_format import KEEP_PREFIX
from actions.slack_keep import KeepFormError, form_key, keep_choices, keep_view, read_form


def _message(*seconds: int) -> list[dict[str, Any]]:
    return [{"type": "section"}, {"type": "actions", "elements": [
        *({"type": "button", "action_id": f"{KEEP_PREFIX}{s}"} for s in seconds),
        {"type": "button", "action_id": "gpuevents_release"}]}]


def _submitted(view: dict[str, Any], reason: str | None, seconds: str) -> dict[str, Any]:
    values = {"reason": {"reason": {"value": reason}}, "for": {"for": {"selected_option": {"value": seconds}}}}
    return {**view, "state": {"values": values}}


def test_the_form_offers_the_messages_durations_with_the_clicked_one_chosen() -> None:
    choices = keep_choices(_message(14400, 28800, 259200))
    assert choices == [14400.0, 28800.0, 259200.0]
    view = keep_view("inc1:fire:0:0", 28800, choices, "Keep n1/gpu0")
    assert form_key(view) == "inc1:fire:0:0"
    select = view["blocks"][2]["element"]
    assert [o["text"]["text"] for o in select["options"]] == ["Keep 4h", "Keep 8h", "Keep 3d"]
    assert select["initial_option"]["value"] == "28800"
    reason = view["blocks"][1]["element"]
    assert (reason["type"], reason["max_length"], view["blocks"][1]["block_id"]) == ("plain_text_input", 500, "reason")
    form = read_form(_submitted(view, "  the eval runs tonight ", "259200"), choices)
    assert (form.key, form.seconds, form.reason) == ("inc1:fire:0:0", 259200.0, "the eval runs tonight")


@pytest.mark.parametrize(("change", "says"), [
    (lambda v: _submitted(v, "x", "31536000"), "not one of the message's Keep durations"),  # a year, not offered
    (lambda v: _submitted({**v, "callback_id": "other"}, "x", "14400"), "not a Keep form"),
    (lambda v: _submitted({**v, "private_metadata": "{}"}, "x", "14400"), "names no message"),
    (lambda v: {**v, "state": {"values": {}}}, "the Keep form is incomplete or altered"),
    (lambda v: _submitted(v, "x", "soon"), "the Keep form is incomplete or altered"),
])
def test_an_altered_or_foreign_submission_is_refused(change: Any, says: str) -> None:
    view = keep_view("k", 14400, [14400.0], "Keep it")
    with pytest.raises(KeepFormError, match=says):
        read_form(change(view), [14400.0])
