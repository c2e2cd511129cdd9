"""The bus against a real nats-server: streams, publish, consume, dedup, outage, KV, request/reply."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from gpuevents import subjects as S
from gpuevents.bus import (
    Bus,
    BusNoResponders,
    BusTimeout,
    Consumer,
    Delivery,
    KvExists,
    KvWrongRevision,
)
from gpuevents.config import NatsConfig, StreamsConfig
from gpuevents.events import GpuInfo, decode_event, make_event
from gpuevents.server import EmbeddedServer
from tests.waiting import wait_for


def _idle(node: str = "n1", index: int = 0, id: str | None = None):  # type: ignore[no-untyped-def]
    return make_event("gpu.idle", node, GpuInfo(node=node, index=index, util_pct=0, idle=True),
                      cluster="c1", id=id)


async def _stream_ids(bus: Bus, stream: str = S.STREAM_EVENTS) -> list[str]:
    return [decode_event(m.data).id async for m in bus.replay(stream, S.EVENTS_ALL)]


async def test_streams_exist_with_the_configured_limits(nats_server: EmbeddedServer) -> None:
    cfg = NatsConfig(url=nats_server.url, streams=StreamsConfig(events_max_age=3600, audit_max_age=7200))
    async with Bus(cfg) as bus:
        await bus.ensure_streams()
        events = await bus.stream_info(S.STREAM_EVENTS)
        audit = await bus.stream_info(S.STREAM_AUDIT)
        act = await bus.stream_info(S.STREAM_ACTIONS)
        assert events.config.max_age == 3600
        assert events.config.subjects == [S.EVENTS_ALL]
        assert audit.config.max_age == 7200
        assert str(getattr(act.config.retention, "value", act.config.retention)) == "workqueue"
        assert (await bus.stream_info(S.STREAM_DLQ)).config.subjects == [S.DLQ_ALL]
        # a second call updates rather than fails
        await bus.ensure_streams()


async def test_publish_then_durable_consume_and_ack(bus: Bus) -> None:
    sent = [_idle(index=i) for i in range(5)]
    for e in sent:
        bus.publish_event(e)
    assert await bus.flush(5)
    consumer = await bus.consumer(S.STREAM_EVENTS, "t1", S.EVENTS_ALL, ack_wait=5)
    got = []
    while len(got) < 5:
        batch = await consumer.fetch(10, timeout=1)
        assert batch, "expected the published events"
        for d in batch:
            got.append(decode_event(d.data))
            assert d.subject == S.event_subject("c1", "n1", "gpu.idle")
            await d.ack()
    assert [e.id for e in got] == [e.id for e in sent]
    assert await consumer.fetch(10, timeout=0.3) == []
    # the durable remembers: a new binding sees nothing left
    again = await bus.consumer(S.STREAM_EVENTS, "t1", S.EVENTS_ALL)
    assert await again.fetch(10, timeout=0.3) == []


async def test_nak_redelivers_and_term_does_not(bus: Bus) -> None:
    bus.publish_event(_idle(index=0))
    bus.publish_event(_idle(index=1))
    assert await bus.flush(5)
    c = await bus.consumer(S.STREAM_EVENTS, "t2", S.EVENTS_ALL, ack_wait=30)
    first = await _fetch_n(c, 2)
    await first[0].nak(delay=0.05)
    await first[1].term()
    redelivered = await wait_for(lambda: c.fetch(2, timeout=0.5), what="redelivery")
    assert len(redelivered) == 1
    assert redelivered[0].num_delivered == 2
    assert decode_event(redelivered[0].data).id == decode_event(first[0].data).id
    await redelivered[0].ack()


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
    indexes = [decode_event(m.data).data.index async for m in bus.replay(S.STREAM_EVENTS, S.EVENTS_ALL)]  # type: ignore[union-attr]
    await bus.close()
    assert indexes == list(range(5, 15))


async def test_kv_compare_and_set(bus: Bus) -> None:
    kv = await bus.kv()
    rev = await kv.create("incident.a", b"1")
    with pytest.raises(KvExists):
        await kv.create("incident.a", b"2")
    rev2 = await kv.update("incident.a", b"2", last=rev)
    with pytest.raises(KvWrongRevision):
        await kv.update("incident.a", b"3", last=rev)
    entry = await kv.get("incident.a")
    assert entry is not None and entry.value == b"2" and entry.revision == rev2
    await kv.put("incident.b", b"x")
    assert sorted(await kv.keys("incident.")) == ["incident.a", "incident.b"]
    await kv.delete("incident.a")
    assert await kv.get("incident.a") is None
    # a deleted key can be created again
    await kv.create("incident.a", b"new")


async def test_request_reply(bus: Bus) -> None:
    async def echo(payload: bytes, subject: str) -> bytes:
        return subject.encode() + b":" + payload

    subject = S.command_subject("c1", "node.7", "kill")
    await bus.serve(subject, echo)
    assert await bus.request(subject, b"hi", timeout=2) == subject.encode() + b":hi"
    with pytest.raises(BusNoResponders):
        await bus.request(S.command_subject("c1", "other", "kill"), b"x", timeout=1)


async def test_a_failing_handler_answers_with_an_error(bus: Bus) -> None:
    async def boom(payload: bytes, subject: str) -> bytes:
        raise RuntimeError("nope")

    await bus.serve("gpuevents.fn.boom", boom)
    reply = await bus.request("gpuevents.fn.boom", b"", timeout=2)
    assert b"nope" in reply and b"error" in reply

    async def quotes(payload: bytes, subject: str) -> bytes:
        raise ValueError("it's \"quoted\" \\ here")

    await bus.serve("gpuevents.fn.quotes", quotes)
    import orjson

    answer = orjson.loads(await bus.request("gpuevents.fn.quotes", b"", timeout=2))
    assert answer == {"error": "ValueError: it's \"quoted\" \\ here"}


async def test_request_timeout_is_a_bus_timeout(bus: Bus) -> None:
    async def slow(payload: bytes, subject: str) -> bytes:
        await asyncio.sleep(5)
        return b""

    await bus.serve("gpuevents.fn.slow", slow)
    with pytest.raises(BusTimeout):
        await bus.request("gpuevents.fn.slow", b"", timeout=0.2)


async def test_replay_since_skips_older_messages(bus: Bus) -> None:
    bus.publish_event(_idle(index=0))
    assert await bus.flush(5)
    ids = await _stream_ids(bus)
    assert len(ids) == 1
    later = datetime.now(UTC) + timedelta(seconds=60)
    assert [m async for m in bus.replay(S.STREAM_EVENTS, S.EVENTS_ALL, since=later)] == []


async def test_acking_a_later_message_does_not_acknowledge_earlier_ones(bus: Bus) -> None:
    """Explicit acks: a delivery that never got handled (lost on a reconnect) comes back after ack_wait,
    whatever was acknowledged after it."""
    for i in range(5):
        bus.publish_event(_idle(index=i))
    assert await bus.flush(5)
    c = await bus.consumer(S.STREAM_EVENTS, "batch", S.EVENTS_ALL, ack_wait=1)
    batch = await _fetch_n(c, 5)
    await batch[-1].ack()
    again: list[Delivery] = []

    async def four_again() -> bool:
        again.extend(await c.fetch(10, timeout=0.5))
        return len(again) >= 4

    await wait_for(four_again, what="the four unacknowledged ones again")
    assert sorted(decode_event(d.data).id for d in again) == sorted(decode_event(d.data).id for d in batch[:4])
    assert all(d.num_delivered == 2 for d in again)
    for d in again:
        await d.ack()
    await wait_for(lambda: _nothing_pending(c), what="every message acknowledged")


async def _fetch_n(c: Consumer, n: int) -> list[Delivery]:
    """`n` deliveries: a fetch returns what has arrived, which may be part of what was published."""
    got: list[Delivery] = []

    async def enough() -> bool:
        got.extend(await c.fetch(n - len(got), timeout=0.5))
        return len(got) >= n

    await wait_for(enough, what=f"{n} deliveries")
    assert len(got) == n
    return got


async def _nothing_pending(c) -> bool:  # type: ignore[no-untyped-def]
    return await c.pending() == 0
