"""The acting engine's request servers over the bus: `gpuevents status`, `snooze`, `free`, `kill` and `cancel`."""

from __future__ import annotations

from typing import Any, Protocol

import orjson
from pydantic import ValidationError

from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.manual import OperatorAction, OperatorActionReply
from rules.core.core import Snooze
from rules.dashboard.free import FreeQuery, free_gpus
from rules.engine.status import StatusResponse


class Answers(Protocol):
    """What the servers ask of the engine (rules.engine.service.Engine)."""

    async def status(self) -> StatusResponse: ...

    async def snooze(self, s: Snooze) -> dict[str, Any]: ...

    async def operator_action(self, req: OperatorAction) -> OperatorActionReply | None: ...


async def serve_requests(bus: Bus, engine: Answers) -> list[Any]:
    """Answer status and snooze requests from `engine`; the subscriptions, to end when it stops acting."""

    async def status(payload: bytes, subject: str) -> bytes:
        return orjson.dumps((await engine.status()).model_dump(mode="json"))

    async def snooze(payload: bytes, subject: str) -> bytes:
        try:
            s = Snooze.model_validate_json(payload)
        except ValidationError as e:
            return orjson.dumps({"ok": False, "error": str(e)})
        return orjson.dumps(await engine.snooze(s))

    async def free(payload: bytes, subject: str) -> bytes:
        """`gpuevents free`: the answer for this engine's part of the fleet (small, whatever the fleet's size)."""
        try:
            query = FreeQuery.model_validate_json(payload)
        except ValidationError as e:
            return orjson.dumps({"ok": False, "error": str(e)})
        st = await engine.status()
        answer = free_gpus(st.fleet, query)
        return orjson.dumps({"ok": True, "partition": st.partition, "partitions": st.partitions,
                             "answer": answer.model_dump(mode="json")})

    async def act(payload: bytes, subject: str) -> bytes | None:
        """`gpuevents kill` / `cancel`: decided by the engine whose part of the fleet holds the target."""
        try:
            req = OperatorAction.model_validate_json(payload)
        except ValidationError as e:
            return OperatorActionReply(ok=False, error=str(e)).model_dump_json().encode()
        reply = await engine.operator_action(req)
        return None if reply is None else reply.model_dump_json().encode()

    return [await bus.serve(S.ENGINE_STATUS, status), await bus.serve(S.ENGINE_SNOOZE, snooze),
            await bus.serve(S.ENGINE_FREE, free), await bus.serve(S.ENGINE_ACT, act)]
