"""The connection against a real nats-server: streams, request/reply."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import orjson
import pytest

from gpuevents import subjects as S
from gpuevents.bus import Bus, BusNoResponders, BusTimeout, Message, connection
from gpuevents.config import NatsConfig, StreamsConfig
from gpuevents.events import GpuInfo, make_event
from gpuevents.server import EmbeddedServer
from tests.waiting import wait_for


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


async def test_request_reply(bus: Bus) -> None:
    async def echo(msg: Message) -> bytes:
        return msg.subject.encode() + b":" + msg.data

    subject = S.command_subject("c1", "node.7", "kill")
    await bus.serve(subject, echo)
    assert await bus.request(subject, b"hi", timeout=2) == subject.encode() + b":hi"
    with pytest.raises(BusNoResponders):
        await bus.request(S.command_subject("c1", "other", "kill"), b"x", timeout=1)


async def test_a_failing_handler_answers_with_an_error(bus: Bus) -> None:
    async def boom(msg: Message) -> bytes:
        raise RuntimeError("nope")

    await bus.serve("gpuevents.fn.boom", boom)
    reply = await bus.request("gpuevents.fn.boom", b"", timeout=2)
    assert b"nope" in reply and b"error" in reply

    async def quotes(msg: Message) -> bytes:
        raise ValueError("it's \"quoted\" \\ here")

    await bus.serve("gpuevents.fn.quotes", quotes)
    answer = orjson.loads(await bus.request("gpuevents.fn.quotes", b"", timeout=2))
    assert answer == {"error": "ValueError: it's \"quoted\" \\ here"}


async def test_request_timeout_is_a_bus_timeout(bus: Bus) -> None:
    async def slow(msg: Message) -> bytes:
        await asyncio.sleep(5)
        return b""

    await bus.serve("gpuevents.fn.slow", slow)
    with pytest.raises(BusTimeout):
        await bus.request("gpuevents.fn.slow", b"", timeout=0.2)


async def test_closing_ends_a_connect_that_waits_to_retry(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A connect that failed waits before it tries again; close() ends that wait instead of sitting it out."""
    async def refused(**opts: Any) -> None:
        raise OSError("connection refused")

    monkeypatch.setattr(nats, "connect", refused)
    monkeypatch.setattr(connection, "CONNECT_BACKOFF_S", 60.0)
    bus = Bus(NatsConfig(url="nats://127.0.0.1:4222", reconnect_wait=30))
    connecting = asyncio.create_task(bus.connect())
    await wait_for(lambda: "retrying in 60.0s" in caplog.text, what="a failed connect")
    await bus.close()
    await asyncio.wait_for(connecting, 5)
    assert not bus.connected


async def test_partitioned_streams_store_each_node_in_the_partition_the_client_computes(
        nats_server: EmbeddedServer) -> None:
    """The engines split the fleet with the server's own `partition()` transform; `node_partition` must agree
    with it, since an engine restores the incidents of its partition's nodes by it."""
    bus = Bus(NatsConfig(url=nats_server.url), name="partitions")
    await bus.connect()
    try:
        await bus.ensure_streams(event_partitions=5)
        assert await bus.event_partitions() == 5
        nodes = [("prod", f"gpu-{i:03d}") for i in range(30)] + [("c.1", "a/b c")]
        for cluster, node in nodes:
            bus.publish_event(make_event("gpu.idle", node, GpuInfo(node=node, index=0, idle=True), cluster=cluster))
        assert await bus.flush(5)
        stored = {m.subject async for m in bus.replay(S.STREAM_EVENTS, S.EVENTS_ALL)}
        expected = {S.stored_event_subject(c, n, "gpu.idle", S.node_partition(c, n, 5)) for c, n in nodes}
        assert stored == expected
        await bus.ensure_streams()  # an agent's call keeps the engines' partitions
        assert await bus.event_partitions() == 5
    finally:
        await bus.close()
