"""The acting engine's request servers over the bus: `gpuevents status`, `snooze`, `free`, `kill` and `cancel`;
status and free answered from the read model (never from the core under the engine's lock), under the max payload."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol

from pydantic import ValidationError

from gpuevents import subjects as S
from gpuevents.bus import Bus, Message, Subscription
from gpuevents.wire import FreeQuery, FreeReply, KeepReply, KeepRequest, bad_request
from gpuevents.wire.manual import OperatorAction, OperatorActionReply
from rules.dashboard.free import bounded, free_gpus_sliced
from rules.engine.read.readmodel import ReadModel
from rules.engine.read.status import HEADROOM, answer
from rules.engine.sites import site_view

KEEP_PAGED = 2  # read models kept for paging (each ~1.2 KB a GPU: 200 MB at 160,000 GPUs)
KEEP_PAGED_S = 120.0  # how long one is kept after its last page was asked


class Answers(Protocol):
    """What the servers ask of the engine (rules.engine.service.Engine)."""

    partition: int | None

    @property
    def partitions(self) -> int: ...

    @property
    def degraded(self) -> str | None: ...

    async def read_model(self, max_age_s: float = 0.0) -> ReadModel: ...

    async def keep(self, req: KeepRequest) -> KeepReply: ...

    async def operator_action(self, req: OperatorAction) -> OperatorActionReply | None: ...


class PagedModels:
    """The read models that pages are being asked of: a pager reads every page from the model of its first."""

    def __init__(self, engine: Answers) -> None:
        self.engine = engine
        self.kept: dict[int, tuple[float, ReadModel]] = {}

    async def __call__(self, version: int | None) -> ReadModel | None:
        now = time.monotonic()
        self.kept = {v: kv for v, kv in self.kept.items() if now - kv[0] <= KEEP_PAGED_S}
        if version is not None:
            found = self.kept.get(version)
            if found is not None:
                self.kept[version] = (now, found[1])
            return found[1] if found is not None else None
        model = await self.engine.read_model()
        self.kept[model.version] = (now, model)
        for v in sorted(self.kept, key=lambda v: self.kept[v][0])[:-KEEP_PAGED]:
            del self.kept[v]
        return model


async def serve_requests(bus: Bus, engine: Answers) -> list[Subscription]:
    """Answer status, free and snooze requests from `engine`; the subscriptions, to end when it stops acting."""
    paged = PagedModels(engine)

    async def status(msg: Message) -> bytes:
        now = datetime.now(UTC)  # the server's `active` is wall-clock seconds ago, whatever the engine's clock
        sites = [site_view(link, now, link.cluster in bus.sites_cut_off) for link in bus.site_state.values()]
        return await answer(paged, msg.data, engine.partition, engine.partitions, bus.max_payload, engine.degraded,
                            sites)

    async def snooze(msg: Message) -> bytes:
        """`gpuevents snooze` / `keep`, Slack's Keep, an approved long keep: one request model."""
        try:
            req = KeepRequest.model_validate_json(msg.data)
        except ValidationError as e:
            return bad_request("snooze", e)
        return (await engine.keep(req)).model_dump_json().encode()

    async def free(msg: Message) -> bytes:
        """`gpuevents free`: the answer for this engine's part of the fleet, its best nodes cut to fit a message."""
        try:
            query = FreeQuery.model_validate_json(msg.data)
        except ValidationError as e:
            return bad_request("free", e)
        model = await engine.read_model()
        found = await free_gpus_sliced(model.fleet_rows(), query)
        found = bounded(found, bus.max_payload - HEADROOM)
        return FreeReply(partition=engine.partition, partitions=engine.partitions,
                         answer=found).model_dump_json().encode()

    async def act(msg: Message) -> bytes | None:
        """`gpuevents kill` / `cancel`: decided by the engine whose part of the fleet holds the target."""
        try:
            req = OperatorAction.model_validate_json(msg.data)
        except ValidationError as e:
            return bad_request("kill or cancel", e)
        reply = await engine.operator_action(req)
        return None if reply is None else reply.model_dump_json().encode()

    return [await bus.serve(S.ENGINE_STATUS, status), await bus.serve(S.ENGINE_SNOOZE, snooze),
            await bus.serve(S.ENGINE_FREE, free), await bus.serve(S.ENGINE_ACT, act)]
