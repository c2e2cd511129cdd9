"""Subscriptions and request servers against a real nats-server: the Message handlers get, answers and error
answers, bounded concurrency, and handlers cancelled when their subscription or the bus ends."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from nats.aio.client import Client as NatsClient

from gpuevents.bus import Bus, BusTimeout, Message
from gpuevents.config import NatsConfig
from tests.waiting import wait_for


async def registered(bus: Bus) -> None:
    """Return once the server has the subscriptions `bus` made so far: it handles a connection's requests in
    order, so a request the bus itself gets answered comes after them (then another connection reaches them)."""
    async def pong(m: Message) -> bytes:
        return b"pong"

    sub = await bus.serve("gpuevents.probe.ping", pong)
    assert await bus.request("gpuevents.probe.ping", b"", timeout=5) == b"pong"
    await sub.unsubscribe()


async def test_a_listener_gets_the_payload_subject_headers_and_reply(bus: Bus, nats_client: NatsClient) -> None:
    got: list[Message] = []

    async def listen(m: Message) -> None:
        got.append(m)

    await bus.subscribe("gpuevents.test.>", listen)
    await registered(bus)
    await nats_client.publish("gpuevents.test.a", b"one", reply="my.inbox", headers={"X-Who": "test"})
    await nats_client.publish("gpuevents.test.b", b"two")
    await wait_for(lambda: len(got) == 2, what="both messages")
    assert got[0] == Message(b"one", "gpuevents.test.a", {"X-Who": "test"}, "my.inbox")
    assert got[1] == Message(b"two", "gpuevents.test.b", {}, "")


async def test_a_server_answers_and_a_failing_one_answers_an_error(bus: Bus) -> None:
    async def upper(m: Message) -> bytes:
        if m.data == b"boom":
            raise ValueError("no \"boom\" here")
        return m.data.upper()

    await bus.serve("gpuevents.fn.upper", upper, concurrency=4)
    assert await bus.request("gpuevents.fn.upper", b"abc", timeout=5) == b"ABC"
    answer = orjson.loads(await bus.request("gpuevents.fn.upper", b"boom", timeout=5))
    assert answer == {"error": "ValueError: no \"boom\" here"}
    assert await bus.request("gpuevents.fn.upper", b"still", timeout=5) == b"STILL"  # it goes on serving


async def test_a_server_that_returns_none_leaves_the_request_to_others(bus: Bus) -> None:
    async def not_mine(m: Message) -> bytes | None:
        return None

    async def mine(m: Message) -> bytes:
        return b"from the other"

    await bus.serve("gpuevents.fn.shared", not_mine)
    await bus.serve("gpuevents.fn.shared", mine)
    assert await bus.request("gpuevents.fn.shared", b"", timeout=5) == b"from the other"


async def test_concurrency_answers_that_many_at_once_and_the_rest_wait(bus: Bus) -> None:
    release = asyncio.Event()
    entered: list[bytes] = []

    async def slow(m: Message) -> bytes:
        entered.append(m.data)
        await release.wait()
        return m.data

    sub = await bus.serve("gpuevents.fn.slow", slow, concurrency=3)
    asking = [asyncio.ensure_future(bus.request("gpuevents.fn.slow", b"%d" % i, timeout=20)) for i in range(5)]
    await wait_for(lambda: len(entered) == 3, what="three requests in the handler together")
    assert sub.in_flight == 3
    # the other two wait for a slot: a request that arrived since is not let in
    await asyncio.sleep(0.2)  # nothing to wait for: this checks that nothing more happens meanwhile
    assert len(entered) == 3
    release.set()
    assert sorted(await asyncio.gather(*asking)) == [b"0", b"1", b"2", b"3", b"4"]
    assert sorted(entered) == [b"0", b"1", b"2", b"3", b"4"]


async def test_one_at_a_time_without_concurrency(bus: Bus) -> None:
    release = asyncio.Event()
    entered: list[bytes] = []

    async def slow(m: Message) -> bytes:
        entered.append(m.data)
        await release.wait()
        return m.data

    await bus.serve("gpuevents.fn.serial", slow)
    asking = [asyncio.ensure_future(bus.request("gpuevents.fn.serial", b"%d" % i, timeout=20)) for i in range(2)]
    await wait_for(lambda: len(entered) == 1, what="the first request in the handler")
    await asyncio.sleep(0.2)  # nothing to wait for: the second must not enter meanwhile
    assert len(entered) == 1
    release.set()
    assert sorted(await asyncio.gather(*asking)) == [b"0", b"1"]


async def test_unsubscribing_cancels_the_handlers_still_running(bus: Bus) -> None:
    cancelled: list[bytes] = []

    async def hangs(m: Message) -> bytes:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(m.data)
            raise
        return b""

    sub = await bus.serve("gpuevents.fn.hangs", hangs, concurrency=2)
    asking = [asyncio.ensure_future(bus.request("gpuevents.fn.hangs", b"%d" % i, timeout=2)) for i in range(2)]
    await wait_for(lambda: sub.in_flight == 2, what="two requests in the handler")
    await sub.unsubscribe()
    assert sorted(cancelled) == [b"0", b"1"] and sub.in_flight == 0
    for result in await asyncio.gather(*asking, return_exceptions=True):
        assert isinstance(result, BusTimeout)  # nobody answers a cancelled request


async def test_closing_the_bus_cancels_the_handlers_still_running(nats_config: NatsConfig) -> None:
    cancelled = asyncio.Event()

    async def hangs(m: Message) -> bytes:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return b""

    async with Bus(nats_config, name="server") as server, Bus(nats_config, name="client") as client:
        sub = await server.serve("gpuevents.fn.hangs", hangs, concurrency=2)
        await registered(server)
        asking = asyncio.ensure_future(client.request("gpuevents.fn.hangs", b"", timeout=2))
        await wait_for(lambda: sub.in_flight == 1, what="the request in the handler")
        await server.close()
        assert cancelled.is_set() and sub.in_flight == 0
        with pytest.raises(BusTimeout):
            await asking


async def test_concurrency_below_one_is_refused(bus: Bus) -> None:
    async def h(m: Message) -> bytes:
        return b""

    with pytest.raises(ValueError, match="concurrency must be at least 1, not 0"):
        await bus.serve("gpuevents.fn.none", h, concurrency=0)
