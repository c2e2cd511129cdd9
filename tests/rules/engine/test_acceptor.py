"""The engine's acceptor: an event is believed only under its own node's subject, and only then cached."""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg

from gpuevents import subjects as S
from gpuevents.bus import Delivery
from gpuevents.events import encode_event
from rules.engine.acceptor import Acceptor
from rules.engine.metrics import EngineMetrics
from tests.rules.helpers import at, gpu, proc, snapshot

ACK = "$JS.ACK.GPUEVENTS.engine.1.{seq}.{seq}.1767571200000000000.0"


def delivery(node: str, subject_node: str, seq: int) -> Delivery:
    raw = encode_event(snapshot(at(0), node, gpus=[gpu(0, pids=[42])], processes=[proc(42)]))
    subject = S.stored_event_subject("default", subject_node, "node.snapshot", None)
    return Delivery(Msg(_client=None, subject=subject, reply=ACK.format(seq=seq), data=raw))  # type: ignore[arg-type]  # no client: never acked here


def test_rejected_events_with_made_up_sources_do_not_grow_the_decoders_cache() -> None:
    dead: list[Exception] = []

    async def dead_letter(_: Delivery, e: Exception) -> None:
        dead.append(e)

    acceptor = Acceptor(60.0, EngineMetrics(), None, dead_letter)

    async def run() -> None:
        assert await acceptor.accept(delivery("n1", "n1", 1)) is not None
        for i in range(20_000):  # one publisher, a new source in every envelope, all under n1's subject
            assert await acceptor.accept(delivery(f"forged-{i}", "n1", i + 2)) is None
        assert await acceptor.accept(delivery("n1", "n1", 20_002)) is not None

    asyncio.run(run())
    assert len(dead) == 20_000 and "says otherwise" in str(dead[-1])
    assert len(acceptor.decoder) == 1  # only the node whose event was believed
