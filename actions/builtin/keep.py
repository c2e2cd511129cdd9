"""The `keep` action: an owner's keep longer than the rule's `snooze_max`, once its approving channel approved it
(the engine asks with `approve:`; the runner waits for the answer) — asks the engine to keep it as asked.

Not written in rules: the engine makes these requests (rules/core/keeps.py)."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from pydantic import AwareDatetime, Field

from actions.approvals import Approval, approval_key
from actions.escaping import no_escape
from actions.protocol import (
    ALL_KINDS,
    ActionContext,
    ActionParams,
    ActionResult,
    PermanentError,
    TransientError,
)
from actions.registry import register
from actions.services import services_of
from gpuevents import subjects as S
from gpuevents.bus import BusNoResponders, BusTimeout
from gpuevents.kvstate import parse_or_none
from gpuevents.records import ActionUnit
from gpuevents.wire import KeepReply, KeepRequest


class KeepParams(ActionParams):
    type: Literal["keep"] = "keep"
    until: AwareDatetime
    by: str = Field(min_length=1)
    asked_reason: str = Field(min_length=1)
    reason: str = ""  # the question the approving channel was asked


@register
class KeepAction:
    type: ClassVar[str] = "keep"
    params = KeepParams
    entity_kinds = ALL_KINDS
    destructive: ClassVar[bool] = False
    unit: ClassVar[ActionUnit] = "entity"
    escape = staticmethod(no_escape)
    engine_only: ClassVar[str] = ("the engine asks it for an owner's keep past the rule's snooze_max; to let owners "
                                  "keep, give a slack action `buttons: {keep: [4h, 24h]}`")

    async def run(self, ctx: ActionContext) -> ActionResult:
        p = ctx.params
        assert isinstance(p, KeepParams)
        services = services_of(ctx)
        got = await services.kv.get(approval_key(ctx.request.key))
        approval = None if got is None else parse_or_none(Approval, got, "the keep is not applied")
        if approval is None or approval.status != "approved":
            raise PermanentError("a long keep runs only once approved, and no approval is recorded")
        if p.until <= services.clock.now():
            return ActionResult(status="refused", detail=f"approved after the keep's end ({p.until:%Y-%m-%d %H:%M})")
        req = KeepRequest(rule=ctx.request.rule, entity_id=ctx.request.entity_id, until=p.until,
                          by=f"{p.by}, approved by {approval.by} in {ctx.request.approve}", reason=p.asked_reason,
                          approved_by=f"{approval.by} in {ctx.request.approve}")
        try:
            raw = await services.bus.request(S.ENGINE_SNOOZE, req.model_dump_json().encode(), timeout=5)
        except (BusNoResponders, BusTimeout) as e:
            raise TransientError(f"no engine answered the approved keep ({e or type(e).__name__})") from None
        reply = KeepReply.model_validate_json(raw)
        if not reply.ok or reply.until is None:
            raise PermanentError(f"the engine did not keep it: {reply.error}")
        return ActionResult(detail=f"kept until {_utc(reply.until)}, approved by {approval.by}")


def _utc(t: datetime) -> str:
    return f"{t:%Y-%m-%d %H:%M} UTC"
