"""Deliveries from a durable consumer: ack, nak, term, one at a time."""

from __future__ import annotations

from gpuevents import subjects as S
from gpuevents.bus import (
    Bus,
    Consumer,
    Delivery,
)
from gpuevents.events import GpuInfo, decode_event, make_event
from tests.waiting import wait_for


def _idle(node: str = "n1", index: int = 0, id: str | None = None):  # type: ignore[no-untyped-def]
    return make_event("gpu.idle", node, GpuInfo(node=node, index=index, util_pct=0, idle=True),
                      cluster="c1", id=id)


async def _stream_ids(bus: Bus, stream: str = S.STREAM_EVENTS) -> list[str]:
    return [decode_event(m.data).id async for m in bus.replay(stream, S.EVENTS_ALL)]


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
