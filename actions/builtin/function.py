"""The `function` action's runtime: a NATS request to `gpuevents.fn.<name>` with the incident; the reply decides."""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from actions.protocol import ActionContext, ActionResult, PermanentError, TransientError
from actions.specs.function import FunctionParams, FunctionSpec
from gpuevents.bus import BusNoResponders, BusTimeout
from gpuevents.subjects import function_subject


class FunctionReply(BaseModel):
    """What a function answers: `{"status": "ok"}`, or failed/refused with `detail`; `retry` asks again."""

    model_config = ConfigDict(extra="ignore")
    status: Literal["ok", "failed", "refused", "retry"] = "ok"
    detail: str = ""
    error: str | None = None
    retry_after: float | None = None
    data: dict[str, Any] = Field(default_factory=dict)


def incident_payload(ctx: ActionContext, data: Any) -> bytes:
    """The request the function gets: the whole action request, plus the rule's `data`."""
    body = ctx.request.model_dump(mode="json")
    body["data"] = data
    body["attempt"] = ctx.attempt
    return orjson.dumps(body)


class FunctionAction(FunctionSpec):
    async def run(self, params: FunctionParams, ctx: ActionContext) -> ActionResult:
        p = params
        subject = function_subject(p.name)
        timeout = p.timeout or ctx.config.actions.timeout
        try:
            raw = await ctx.services.bus.request(subject, incident_payload(ctx, p.data), timeout * 0.9)
        except BusNoResponders:
            raise TransientError(f"no function answers on {subject}") from None
        except BusTimeout:
            raise TransientError(f"function {p.name} did not answer within {timeout * 0.9:.1f}s") from None
        try:
            reply = FunctionReply.model_validate_json(raw)
        except ValidationError as e:
            raise PermanentError(f"function {p.name} answered something that is not a reply: "
                                 f"{raw[:200]!r} ({e.errors()[0]['msg']})") from None
        if reply.error:
            return ActionResult(status="failed", detail=f"function {p.name} failed: {reply.error}")
        if reply.status == "retry":
            raise TransientError(reply.detail or f"function {p.name} asked to retry", reply.retry_after)
        return ActionResult(status=reply.status, detail=reply.detail, data=reply.data)
