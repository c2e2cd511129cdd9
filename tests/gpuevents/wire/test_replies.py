"""The replies every engine server shares: a malformed request's error names each wrong field on one line; what
an asker says when no engine answered."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuevents.wire import ErrorReply, KeepRequest, NoEngine, bad_request


def test_a_malformed_request_is_answered_with_every_wrong_field() -> None:
    with pytest.raises(ValidationError) as e:
        KeepRequest.model_validate_json(b'{"rule": "", "entity_id": "n1/gpu0", "until": "tomorrow", "by": "a"}')
    reply = ErrorReply.model_validate_json(bad_request("snooze", e.value))
    assert reply.ok is False
    assert reply.error == ("malformed snooze request: rule: String should have at least 1 character; "
                           "until: Input should be a valid datetime or date, input is too short")
    assert "\n" not in reply.error and "https://" not in reply.error  # one line, without pydantic's links


def test_no_engine_says_nothing_was_stored_and_what_to_do() -> None:
    text = str(NoEngine("n1/gpu0 was not kept", "nobody answers on gpuevents.engine.snooze"))
    assert text == ("no engine answered (nobody answers on gpuevents.engine.snooze): n1/gpu0 was not kept. Nothing "
                    "was stored; start `gpuevents engine` (or wait for one to take over) and ask again")
