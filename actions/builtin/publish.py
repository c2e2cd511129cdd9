"""The `publish` action's runtime: publishes `data` to `subject`, so rules and other programs can chain on it."""

from __future__ import annotations

from typing import Any

from actions.protocol import ActionContext, ActionResult, PermanentError, TransientError
from actions.specs.publish import STORED_PREFIXES, PublishParams, PublishSpec
from gpuevents.bus import BusError, BusNoResponders
from gpuevents.events import dumps


def encode(data: Any) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    return dumps(data)


class PublishAction(PublishSpec):
    async def run(self, params: PublishParams, ctx: ActionContext) -> ActionResult:
        p = params
        bus = ctx.services.bus
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
