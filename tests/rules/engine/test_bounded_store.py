"""A JetStream with little room (issue 23, item 3): a node flooding its own subject cannot stop the engine, and an
engine whose writes are refused for lack of room stays up, says it is degraded, and recovers by itself."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import nats
import orjson
import pytest
from nats.aio.client import Client

from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.config import Config
from gpuevents.server import find_binary, free_port
from rules.engine.service import Engine
from rules.engine.store import incident_key
from tests.deploy.conftest import _answers
from tests.rules.engine.conftest import snapshot
from tests.waiting import wait_for

STORE = 24 << 20  # the server's whole JetStream disk
NOW_RULE = """\
rules:
  - name: held-now
    entity: gpu
    when: gpu.idle and gpu.processes
    actions:
      - type: log
        message: "held"
  - name: held-soon
    entity: gpu
    when: gpu.idle and gpu.processes
    for: 2s
    actions:
      - type: log
        message: "held a while"
"""


@pytest.fixture
def small_server(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    conf = tmp_path / "nats.conf"
    conf.write_text(f'host: "127.0.0.1"\nport: {port}\n'
                    f'jetstream {{ store_dir: "{tmp_path / "js"}", max_file_store: {STORE}, max_mem_store: 8MB }}\n')
    log = tmp_path / "nats.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(find_binary()), "-c", str(conf)], stdout=out, stderr=out,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not _answers(port):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def small_config(url: str, tmp_path: Path) -> Config:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "now.yaml").write_text(NOW_RULE)
    return Config.model_validate({
        "cluster": "c1",
        "nats": {"url": url, "reconnect_wait": 0.2, "connect_timeout": 2, "publish_timeout": 2,
                 "streams": {"max_bytes": "6MiB", "events_max_msgs_per_subject": 200}},  # events: 4 MiB
        "engine": {"rules": [str(rules)], "tick": "30s", "lease_ttl": "10s",
                   "usage_db": str(tmp_path / "usage.sqlite")},
        "agent": {"snapshot_interval": "1h"},
    })


@pytest.fixture
async def raw(small_server: str) -> AsyncIterator[Client]:
    nc = await nats.connect(small_server)
    try:
        yield nc
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def running_engine(config: Config) -> AsyncIterator[tuple[Engine, Bus, asyncio.Task[None]]]:
    bus = Bus(config.nats, name="engine", role="engine")
    await bus.connect()
    await bus.ensure_streams()
    engine = await Engine.open(config, bus)
    stop = asyncio.Event()
    task = asyncio.create_task(engine.run(stop))
    try:
        await wait_for(lambda: engine.ready.is_set() or task.done(), what="the lease")
        yield engine, bus, task
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
        await bus.close(flush_timeout=1)


async def _acted(bus: Bus, node: str) -> bool:
    """The rule fired on the node's GPU: its incident is stored and its action request is queued."""
    kv = await bus.kv()
    info = await bus.stream_info(S.STREAM_ACTIONS)
    return info.state.messages > 0 and await kv.get(incident_key("held-now", f"{node}/gpu0")) is not None


async def test_a_node_flooding_its_own_subject_does_not_stop_the_engine(
    small_server: str, raw: Client, tmp_path: Path
) -> None:
    """Before: streams had max_age only; the flood filled the store and the engine exited."""
    config = small_config(small_server, tmp_path)
    async with running_engine(config) as (_, bus, task):
        flood = S.event_subject("c1", "n1", "node.snapshot")
        junk = b"x" * 8192
        for _ in range(4000):  # 32 MiB on one node's subject: more than the whole store
            await raw.publish(flood, junk)
        await raw.flush()
        info = await bus.stream_info(S.STREAM_EVENTS)
        assert info.state.bytes <= 4 << 20
        bus.publish_event(snapshot("n2", datetime.now(UTC), pid=7))
        assert await bus.flush(10)
        await wait_for(lambda: _acted(bus, "n2"), 60, interval=0.2, what="the engine to act on n2")
        assert not task.done()


async def test_an_engine_whose_writes_find_no_room_is_degraded_and_recovers(
    small_server: str, raw: Client, tmp_path: Path
) -> None:
    config = small_config(small_server, tmp_path)
    js = raw.jetstream()
    async with running_engine(config) as (engine, bus, task):
        # held-now fires at once; held-soon's firing, 2 s later, is a write that will find no room
        bus.publish_event(snapshot("n3", datetime.now(UTC), pid=9))
        assert await bus.flush(10)
        await wait_for(lambda: _acted(bus, "n3"), 30, interval=0.2, what="held-now on n3")
        await js.add_stream(name="FILLER", subjects=["filler.>"])
        chunk = b"f" * (256 << 10)
        for i in range(400):  # until JetStream refuses: the store is full
            try:
                await js.publish(f"filler.{i}", chunk, timeout=2)
            except nats.errors.Error as e:  # nats-py's JetStream errors and timeouts
                refused = e
                break
        else:
            raise AssertionError("the store never filled")
        assert "insufficient" in str(refused) or "resources" in str(refused), refused
        await wait_for(lambda: engine.committer.degraded is not None, 30, what="the engine to be degraded")
        status = orjson.loads(await bus.request(S.ENGINE_STATUS, b"{}", timeout=5))  # answered at once
        assert status["degraded"] and "no room" in status["degraded"]
        assert engine.metrics.registry.get_sample_value("gpuevents_engine_degraded") == 1
        assert (engine.metrics.registry.get_sample_value("gpuevents_store_full_total") or 0) >= 1
        assert not task.done()

        await js.delete_stream("FILLER")  # space returns
        await wait_for(lambda: engine.committer.degraded is None, 30, what="the engine to recover")
        kv = await bus.kv()
        soon = await kv.get(incident_key("held-soon", "n3/gpu0"))
        assert soon is not None and b'"firing"' in soon.value
        assert engine.metrics.registry.get_sample_value("gpuevents_engine_degraded") == 0
        assert orjson.loads(await bus.request(S.ENGINE_STATUS, b"{}", timeout=5))["degraded"] is None
