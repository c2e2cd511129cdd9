"""The `publish` action: publishes `data` to `subject`, so rules and other programs can chain on it."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from actions.escaping import no_escape
from actions.protocol import (
    ALL_KINDS,
    ActionContext,
    ActionParams,
    ActionResult,
    ActionUnit,
    PermanentError,
    TransientError,
)
from actions.registry import register
from actions.services import services_of
from gpuevents import subjects as S
from gpuevents.bus import BusError, BusNoResponders
from gpuevents.events import dumps

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


def encode(data: Any) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    return dumps(data)


@register
class PublishAction:
    type: ClassVar[str] = "publish"
    params = PublishParams
    entity_kinds = ALL_KINDS
    destructive: ClassVar[bool] = False
    unit: ClassVar[ActionUnit] = "entity"
    escape = staticmethod(no_escape)

    async def run(self, ctx: ActionContext) -> ActionResult:
        p = ctx.params
        assert isinstance(p, PublishParams)
        bus = services_of(ctx).bus
        payload = encode(p.data)
        stored = p.jetstream if p.jetstream is not None else p.subject.startswith(STORED_PREFIXES)
        try:
            if stored:
                # The action key as message id: a retried publish is stored once.
                seq = await bus.js_publish(p.subject, payload, msg_id=f"publish-{ctx.request.key}")
                return ActionResult(detail=f"published to {p.subject} (stream seq {seq})", data={"seq": seq})
            await bus.publish_core(p.subject, payload)
        except BusNoResponders as e:
            raise PermanentError(f"{e}: set `jetstream: false` for a plain NATS subject") from None
        except BusError as e:
            raise TransientError(str(e)) from e
        return ActionResult(detail=f"published to {p.subject}")
