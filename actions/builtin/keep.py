"""The `keep` action's runtime: once the rule's approving channel approved an owner's keep past `snooze_max` (the
runner waits for the answer), ask the engine to keep it as asked."""

from __future__ import annotations

from datetime import datetime

from actions.approvals import Approval, approval_key
from actions.protocol import ActionContext, ActionResult, PermanentError, TransientError
from actions.specs.keep import KeepParams, KeepSpec
from gpuevents import subjects as S
from gpuevents.bus import BusNoResponders, BusTimeout
from gpuevents.kvstate import parse_or_none
from gpuevents.wire import KeepReply, KeepRequest


class KeepAction(KeepSpec):
    async def run(self, params: KeepParams, ctx: ActionContext) -> ActionResult:
        services = ctx.services
        got = await services.kv.get(approval_key(ctx.request.key))
        approval = None if got is None else parse_or_none(Approval, got, "the keep is not applied")
        if approval is None or approval.status != "approved":
            raise PermanentError("a long keep runs only once approved, and no approval is recorded")
        if params.until <= services.clock.now():
            return ActionResult(status="refused", detail=f"approved after the keep's end ({_utc(params.until)})")
        where = f"{approval.by} in {ctx.request.approve}"
        req = KeepRequest(rule=ctx.request.rule, entity_id=ctx.request.entity_id, until=params.until,
                          by=f"{params.by}, approved by {where}", reason=params.asked_reason, approved_by=where)
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
