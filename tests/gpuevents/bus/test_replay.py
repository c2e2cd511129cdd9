"""Replaying a stream's history against a real nats-server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.events import Event, GpuInfo, decode_event, make_event


def _idle(node: str = "n1", index: int = 0, id: str | None = None) -> Event:
    return make_event("gpu.idle", node, GpuInfo(node=node, index=index, util_pct=0, idle=True),
                      cluster="c1", id=id)


async def _stream_ids(bus: Bus, stream: str = S.STREAM_EVENTS) -> list[str]:
    return [decode_event(m.data).id async for m in bus.replay(stream, S.EVENTS_ALL)]


async def test_replay_since_skips_older_messages(bus: Bus) -> None:
    bus.publish_event(_idle(index=0))
    assert await bus.flush(5)
    ids = await _stream_ids(bus)
    assert len(ids) == 1
    later = datetime.now(UTC) + timedelta(seconds=60)
    assert [m async for m in bus.replay(S.STREAM_EVENTS, S.EVENTS_ALL, since=later)] == []
