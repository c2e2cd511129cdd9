"""The `publish` action's parameters: `data` to a `subject` rules may publish to; runtime actions.builtin.publish."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from actions.protocol import Action, ActionParams
from actions.registry import register
from gpuevents import subjects as S

STORED_PREFIXES = (f"{S.PREFIX}.evt.",)
#: subjects a rule may not publish to, with what to use instead: commands to agents, action requests
#: (they would skip the destructive classification, protection and fleet holds), the audit, functions,
#: and the server's own JetStream, KV and reply subjects
FORBIDDEN_PREFIXES = {
    f"{S.PREFIX}.cmd.": "agent commands go through their actions (`kill`, ...)",
    f"{S.PREFIX}.act.": "an action request goes through its own action type, with its checks",
    f"{S.PREFIX}.audit.": "the audit is written by the action runner only",
    f"{S.PREFIX}.dlq.": "the dead-letter stream is written by the engine only",
    f"{S.PREFIX}.fn.": "use the `function` action to call a function",
    "$JS.": "JetStream's API is not for rules",
    "$KV.": "the KV bucket is not for rules",
    "_INBOX.": "reply subjects are not for rules",
}


class PublishParams(ActionParams):
    type: Literal["publish"] = "publish"
    subject: str = Field(min_length=1, pattern=r"^[^\s*>]+$")
    data: Any = None
    jetstream: bool | None = Field(default=None, description="unset: JetStream for subjects our streams keep "
                                   "(gpuevents.evt.>), core NATS otherwise")

    @field_validator("subject")
    @classmethod
    def _not_reserved(cls, subject: str) -> str:
        for prefix, why in FORBIDDEN_PREFIXES.items():
            if subject.startswith(prefix) or subject == prefix[:-1]:
                raise ValueError(f"{subject!r} is reserved ({prefix}…): {why}")
        return subject


@register
class PublishSpec(Action[PublishParams]):
    type: ClassVar[str] = "publish"
    params = PublishParams
    runtime: ClassVar[str | None] = "actions.builtin.publish:PublishAction"
