"""The pull consumer against a real nats-server: deliveries and their acks, prompt fetches, prefetch given
back on close, refusals and restarts."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext

from gpuevents import subjects as S
from gpuevents.bus import Bus, BusError, Consumer, Delivery
from gpuevents.bus.consumer import open_consumer
from gpuevents.events import Event, GpuInfo, decode_event, make_event
from gpuevents.server import EmbeddedServer
from tests.conftest import PullRequests
from tests.waiting import wait_for


def _idle(index: int) -> Event:
    return make_event("gpu.idle", "n1", GpuInfo(node="n1", index=index, util_pct=0, idle=True), cluster="c1")


async def _publish(bus: Bus, *indexes: int) -> list[str]:
    events = [_idle(i) for i in indexes]
    for e in events:
        bus.publish_event(e)
    assert await bus.flush(5)
    return [e.id for e in events]


async def _fetch(c: Consumer, n: int, timeout: float = 10) -> list[Delivery]:
    """`n` deliveries: a fetch returns what has arrived, which may be part of what was published."""
    got: list[Delivery] = []

    async def enough() -> bool:
        if len(got) < n:
            got.extend(await c.fetch(n - len(got), timeout=0.5))
        return len(got) >= n

    await wait_for(enough, timeout, what=f"{n} deliveries")
    assert len(got) == n
    return got


async def _nothing_pending(js: JetStreamContext, durable: str) -> bool:
    info = await js.consumer_info(S.STREAM_EVENTS, durable)
    return (info.num_pending or 0) + (info.num_ack_pending or 0) == 0


async def test_publish_then_durable_consume_and_ack(bus: Bus) -> None:
    sent = [_idle(index=i) for i in range(5)]
    for e in sent:
        bus.publish_event(e)
    assert await bus.flush(5)
    consumer = await bus.consumer(S.STREAM_EVENTS, "t1", S.EVENTS_ALL, ack_wait=5)
    got: list[Event] = []
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
    first = await _fetch(c, 2)
    await first[0].nak(delay=0.05)
    await first[1].term()
    redelivered = await wait_for(lambda: c.fetch(2, timeout=0.5), what="redelivery")
    assert len(redelivered) == 1
    assert redelivered[0].num_delivered == 2
    assert decode_event(redelivered[0].data).id == decode_event(first[0].data).id
    await redelivered[0].ack()


async def test_acking_a_later_message_does_not_acknowledge_earlier_ones(bus: Bus, jetstream: JetStreamContext) -> None:
    """Explicit acks: a delivery that never got handled (lost on a reconnect) comes back after ack_wait,
    whatever was acknowledged after it."""
    for i in range(5):
        bus.publish_event(_idle(index=i))
    assert await bus.flush(5)
    c = await bus.consumer(S.STREAM_EVENTS, "batch", S.EVENTS_ALL, ack_wait=1)
    batch = await _fetch(c, 5)
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
    await wait_for(lambda: _nothing_pending(jetstream, "batch"), what="every message acknowledged")


async def test_a_fetch_returns_what_is_there_without_waiting_for_a_full_batch(bus: Bus) -> None:
    ids = await _publish(bus, 0, 1, 2)
    c = await bus.consumer(S.STREAM_EVENTS, "prompt", S.EVENTS_ALL)
    start = time.monotonic()
    first = await c.fetch(512, timeout=20)
    assert time.monotonic() - start < 10, "the fetch waited for its batch instead of returning what was there"
    assert first, "nothing came although three were there"
    first += await _fetch(c, len(ids) - len(first))  # all three, though maybe in more than one read
    assert [decode_event(d.data).id for d in first] == ids
    # a fetch already waiting gets what is published meanwhile
    waiting = asyncio.create_task(c.fetch(512, timeout=20))
    later = await _publish(bus, 3)
    got = await asyncio.wait_for(waiting, 15)
    assert [decode_event(d.data).id for d in got] == later
    assert got[0].num_delivered == 1 and got[0].stream_seq == 4 and got[0].time is not None
    await got[0].ack()
    await c.close()


async def test_prefetched_and_arriving_messages_are_given_back_when_the_consumer_closes(bus: Bus) -> None:
    """The engine's settings: closing right after a batch (a step-down) leaves nothing waiting for ack_wait."""
    ids = await _publish(bus, *range(300))
    c = await bus.consumer(S.STREAM_EVENTS, "pre", S.EVENTS_ALL, ack_wait=30, prefetch=True)
    first = await c.fetch(100, timeout=5)
    for d in first:
        await d.ack()
    await c.close()
    # given back at once (nak): a new binding gets the rest long before the 30 s ack_wait
    again = await bus.consumer(S.STREAM_EVENTS, "pre", S.EVENTS_ALL, ack_wait=30)
    rest = await _fetch(again, 300 - len(first), timeout=10)
    assert sorted(decode_event(d.data).id for d in first + rest) == sorted(ids)


async def test_a_fetch_claims_no_more_than_it_asks_for(bus: Bus, jetstream: JetStreamContext) -> None:
    """The action runner asks for as many as it has free slots; what is published while it is busy stays on
    the server for the other runners instead of waiting in this one's queue past ack_wait."""
    await _publish(bus, 0)
    c = await bus.consumer(S.STREAM_EVENTS, "claim", S.EVENTS_ALL)
    got = await c.fetch(2, timeout=5)
    assert len(got) == 1
    await _publish(bus, 1, 2, 3, 4, 5)
    info = await jetstream.consumer_info(S.STREAM_EVENTS, "claim")
    assert info.num_ack_pending == 1 and info.num_pending == 5
    more = await _fetch(c, 3)
    assert len(more) == 3
    info = await jetstream.consumer_info(S.STREAM_EVENTS, "claim")
    assert info.num_ack_pending == 4 and info.num_pending == 2


async def test_a_deleted_consumer_is_created_again_without_a_storm_of_requests(
        bus: Bus, nats_client: NatsClient, monkeypatch: pytest.MonkeyPatch) -> None:
    requests = PullRequests.watch(nats_client, S.STREAM_EVENTS, "gone", monkeypatch)
    c = await open_consumer(nats_client, nats_client.jetstream(), S.STREAM_EVENTS, "gone", S.EVENTS_ALL,
                            ack_wait=30, max_deliver=-1, max_ack_pending=1000, prefetch=False)
    assert await c.fetch(10, timeout=0.3) == []
    await nats_client.jetstream().delete_consumer(S.STREAM_EVENTS, "gone")
    ids = await _publish(bus, 7)
    got = await _fetch(c, 1, timeout=15)
    assert [decode_event(d.data).id for d in got] == ids
    assert 0 < requests.count < 50, f"{requests.count} pull requests: the consumer spun on a refusal"


async def test_a_consumer_keeps_fetching_across_a_server_restart(bus: Bus, nats_server: EmbeddedServer) -> None:
    c = await bus.consumer(S.STREAM_EVENTS, "restart", S.EVENTS_ALL, prefetch=True)
    before = await _publish(bus, 0)
    got = await _fetch(c, 1)
    assert [decode_event(d.data).id for d in got] == before
    await got[0].ack()
    nats_server.stop()
    nats_server.start()
    after = await _publish(bus, 1)  # buffered until the bus has reconnected
    got = await _fetch(c, 1, timeout=20)
    assert [decode_event(d.data).id for d in got] == after
    await got[0].ack()


async def test_a_consumer_recovers_after_refusals_that_outlast_its_fetches(
        bus: Bus, nats_client: NatsClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """JetStream answers 503 for longer than a fetch's timeout (the consumer is gone and cannot be created
    yet): the consumer backs off across fetches and pulls again once it can."""
    await bus.consumer(S.STREAM_EVENTS, "refused", S.EVENTS_ALL)
    js = nats_client.jetstream()
    requests = PullRequests.watch(nats_client, S.STREAM_EVENTS, "refused", monkeypatch)
    failing_until = time.monotonic() + 3.0
    attempts = []

    async def recreate() -> None:
        attempts.append(time.monotonic())
        if time.monotonic() < failing_until:
            raise BusError("JetStream is not ready")
        await js.add_consumer(S.STREAM_EVENTS, durable_name="refused", ack_policy="explicit",
                              filter_subject=S.EVENTS_ALL)

    c = await Consumer(nats_client, S.STREAM_EVENTS, "refused", recreate=recreate).start()
    await js.delete_consumer(S.STREAM_EVENTS, "refused")
    ids = await _publish(bus, 9)
    got = await _fetch(c, 1, timeout=20)
    assert [decode_event(d.data).id for d in got] == ids
    assert len(attempts) >= 2 and 0 < requests.count < 50
