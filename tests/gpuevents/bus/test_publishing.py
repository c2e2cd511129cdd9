"""Publishing against a real nats-server: the event buffer, dedup, an outage, pipelined publishes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from nats.js import JetStreamContext

from gpuevents import subjects as S
from gpuevents.bus import Bus, BusNoResponders, PublishItem
from gpuevents.config import NatsConfig
from gpuevents.events import Event, GpuInfo, decode_event, make_event
from gpuevents.records import AuditRecord
from gpuevents.server import EmbeddedServer
from tests.conftest import stored_messages
from tests.waiting import wait_for

T0 = datetime(2026, 1, 5, tzinfo=UTC)


def _idle(node: str = "n1", index: int = 0, id: str | None = None) -> Event:
    return make_event("gpu.idle", node, GpuInfo(node=node, index=index, util_pct=0, idle=True),
                      cluster="c1", id=id)


async def _stream_ids(bus: Bus, stream: str = S.STREAM_EVENTS) -> list[str]:
    return [decode_event(m.data).id async for m in bus.replay(stream, S.EVENTS_ALL)]


async def test_a_duplicate_event_id_is_stored_once(bus: Bus) -> None:
    e = _idle()
    bus.publish_event(e)
    bus.publish_event(e)
    assert await bus.flush(5)
    seq1 = await bus.js_publish(S.event_subject("c1", "n1", "gpu.idle"), b"{}", msg_id=e.id)
    info = await bus.stream_info(S.STREAM_EVENTS)
    assert info.state.messages == 1
    assert seq1 == 1


async def test_outage_every_event_arrives_exactly_once(nats_server: EmbeddedServer) -> None:
    cfg = NatsConfig(url=nats_server.url, reconnect_wait=0.1, publish_timeout=1, connect_timeout=1)
    bus = Bus(cfg, name="outage")
    await bus.connect()
    await bus.ensure_streams()
    sent: list[str] = []

    async def publish(n: int) -> None:
        for _ in range(n):
            e = _idle(index=len(sent) % 8)
            sent.append(e.id)
            bus.publish_event(e)
            await asyncio.sleep(0.001)  # pace the publisher like an agent; not a wait for a condition

    await publish(100)
    nats_server.stop()
    await wait_for(lambda: not bus.connected, what="the client to notice the outage")
    await publish(200)  # publishing goes on while the server is down
    assert bus.stats.buffered > 0
    nats_server.start()
    await publish(100)
    assert await bus.flush(30), f"buffer not drained: {bus.stats}"
    ids = await _stream_ids(bus)
    await bus.close()
    assert len(ids) == len(sent) == 400
    assert sorted(ids) == sorted(sent)  # every id exactly once
    assert bus.stats.dropped == 0


async def test_a_full_buffer_drops_the_oldest_and_counts(nats_server: EmbeddedServer) -> None:
    cfg = NatsConfig(url=nats_server.url, publish_buffer=10)
    bus = Bus(cfg)  # never connected: everything buffers
    for i in range(15):
        bus.publish_event(_idle(index=i))
    assert bus.stats.dropped == 5
    assert bus.stats.buffered == 10
    await bus.connect()
    await bus.ensure_streams()
    assert await bus.flush(5)
    indexes = [decode_event(m.data).data.index async for m in bus.replay(S.STREAM_EVENTS, S.EVENTS_ALL)]  # type: ignore[union-attr]  # all gpu.idle
    await bus.close()
    assert indexes == list(range(5, 15))


async def test_publish_many_stores_each_once_in_order_and_reports_failures_per_item(
        bus: Bus, jetstream: JetStreamContext) -> None:
    records = [AuditRecord(time=T0, kind="reload", detail=f"r{i}") for i in range(5)]
    items = [PublishItem(S.audit_subject("engine"), r.model_dump_json().encode(), msg_id=r.id) for r in records]
    items.insert(2, PublishItem("no.stream.here", b"x"))
    results = await bus.js_publish_many(items)
    assert isinstance(results[2], BusNoResponders)
    seqs = [r for i, r in enumerate(results) if i != 2 and isinstance(r, int)]
    assert len(seqs) == 5 and seqs == sorted(seqs) and len(set(seqs)) == 5
    again = await bus.js_publish_many(items[:2])  # the same msg ids: deduplicated, the same sequences
    assert again == seqs[:2]
    stored = await stored_messages(jetstream, S.STREAM_AUDIT)
    assert [AuditRecord.model_validate_json(m.data).detail for m in stored] == [f"r{i}" for i in range(5)]
    assert await bus.js_publish_many([]) == []
