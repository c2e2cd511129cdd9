"""The log action: its message written and audited."""

from __future__ import annotations

from actions.runner import ActionRunner
from tests.actions.conftest import make_config, make_request


async def test_log_writes_the_message_and_audits_it() -> None:
    record = await (await ActionRunner.open(None, make_config())).process(
        make_request("log", {"message": "idle-gpu-2h resolved on n1/gpu0"}, phase="resolve"))
    assert (record.outcome, record.detail) == ("ok", "idle-gpu-2h resolved on n1/gpu0")
