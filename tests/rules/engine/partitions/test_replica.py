"""Engine replicas that split the fleet by node on a real three-server NATS cluster: each partition under its own
lease, partitions moving when a replica dies, nothing run twice or lost, a NATS server lost without a gap."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.cli.ask_status import ask_pages
from gpuevents.clock import SystemClock
from gpuevents.config import Config
from gpuevents.records import ActionRequest
from rules.engine.partitions import replica as replica_module
from rules.engine.partitions.lease import Lease
from rules.engine.partitions.replica import EngineReplica
from tests.conftest import stored_messages
from tests.nats_cluster import NatsCluster
from tests.rules.engine.conftest import snapshot
from tests.waiting import wait_for

PARTITIONS = 6
RULES = """\
rules:
  - name: idle-log
    entity: gpu
    when: gpu.idle and gpu.processes
    actions: [{type: log, message: "{{ entity.id }}"}]
"""


def cluster_config(cluster: NatsCluster, tmp_path: Path) -> Config:
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "idle.yaml").write_text(RULES)
    return Config.model_validate({
        "cluster": "c1",
        "nats": {"url": cluster.urls, "reconnect_wait": 0.2, "connect_timeout": 2, "publish_timeout": 5,
                 "streams": {"replicas": 3}},
        "engine": {"rules": [str(rules)], "lease_ttl": "2s", "partitions": PARTITIONS,
                   "usage_db": str(tmp_path / "usage.sqlite")},
        "agent": {"snapshot_interval": "1h"},
    })


@contextlib.asynccontextmanager
async def replica(config: Config, name: str) -> AsyncIterator[tuple[EngineReplica, asyncio.Task[None], Bus]]:
    bus = Bus(config.nats, name=name)
    await bus.connect()
    await bus.ensure_streams(PARTITIONS)
    r = await EngineReplica.open(config, bus, clock=SystemClock(), holder=name)
    stop = asyncio.Event()
    task = asyncio.create_task(r.run(stop))
    try:
        yield r, task, bus
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)
        await bus.close(flush_timeout=1)


def held(*replicas: EngineReplica) -> list[int]:
    return sorted(p for r in replicas for p in r.held)


async def test_replicas_split_the_fleet_and_a_dead_replicas_partitions_move(
        nats_cluster: NatsCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = cluster_config(nats_cluster, tmp_path)
    nodes = [f"node-{i:02d}" for i in range(24)]
    async with replica(config, "a") as (a, task_a, bus), replica(config, "b") as (b, _, _), \
            replica(config, "c") as (c, _, _):
        await wait_for(lambda: held(a, b, c) == list(range(PARTITIONS)), timeout=30,
                       what="every partition held by one replica")
        await wait_for(lambda: all(len(r.held) == 2 for r in (a, b, c)), timeout=30,
                       what="two partitions each (a fair share of six among three)")
        for n in nodes:
            bus.publish_event(snapshot(n, SystemClock().now()))
        assert await bus.flush(10)
        await wait_for(lambda: sum(len(e.core.open_incidents()) for r in (a, b, c) for e in r.engines
                                   if e.leader.is_set()) == len(nodes),
                       timeout=30, what="every node's incident open in its partition")
        seen = [n.name async for page in ask_pages(bus) for n in page.nodes]
        assert sorted(seen) == nodes
        # a dies: no lease released, no goodbye in KV (a crash)
        lost = sorted(a.held)

        async def crashed(*_: object) -> None:
            return None

        monkeypatch.setattr(Lease, "release", crashed)
        monkeypatch.setattr(replica_module.EngineReplica, "_leave", crashed)
        died = asyncio.get_running_loop().time()
        task_a.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task_a
        await wait_for(lambda: held(b, c) == list(range(PARTITIONS)), timeout=20,
                       what="b and c to take over a's partitions")
        moved_after = asyncio.get_running_loop().time() - died
        assert moved_after <= 2 * 2.0 + 2.0  # within two lease periods (and a renewal's slack)
        assert set(lost) <= set(b.held) | set(c.held)
        await wait_for(lambda: sum(len(e.core.open_incidents()) for r in (b, c) for e in r.engines
                                   if e.leader.is_set()) == len(nodes),
                       timeout=30, what="no incident lost with the dead replica")
        requests = [ActionRequest.model_validate_json(m.data)
                    for m in await stored_messages(bus._jetstream(), S.STREAM_ACTIONS)]
        assert len(requests) == len(nodes) and len({r.key for r in requests}) == len(nodes)  # none twice


async def test_publishing_and_consuming_go_on_when_a_nats_server_dies(
        nats_cluster: NatsCluster, tmp_path: Path) -> None:
    config = cluster_config(nats_cluster, tmp_path)
    async with replica(config, "solo") as (r, _, bus):
        await wait_for(lambda: len(r.held) == PARTITIONS, timeout=30, what="the only replica to hold everything")
        bus.publish_event(snapshot("before", SystemClock().now()))
        assert await bus.flush(10)
        nats_cluster.kill_server(nats_cluster.servers[0])
        for i in range(10):
            bus.publish_event(snapshot(f"after-{i}", SystemClock().now()))
        assert await bus.flush(30)
        # Every node's event consumed and acted on: its incident is open. (Counted from incidents, which a
        # partition's engine restores from KV when it takes its lease back after the outage, not from the nodes
        # in memory, which a re-taken partition learns again from the nodes' next snapshots.)
        await wait_for(lambda: sorted(i.node for e in r.engines if e.leader.is_set()
                                      for i in e.core.open_incidents()) == sorted(
                           ["before", *(f"after-{i}" for i in range(10))]),
                       timeout=120, what="every node's incident open after a server died")


async def test_a_replica_with_the_default_holder_name_announces_itself(engine_config: Config, bus: Bus) -> None:
    # The default holder is `host:pid`; a `:` is not allowed in a KV key, so the replica could not announce
    # itself and two replicas never shared the partitions (found by benchmarks/engine_scaleout.py).
    config = engine_config.model_copy(update={"engine": engine_config.engine.model_copy(update={"partitions": 2})})
    await bus.ensure_streams(2)
    r = await EngineReplica.open(config, bus, clock=SystemClock(), holder="gpu-host:4242")
    stop = asyncio.Event()
    task = asyncio.create_task(r.run(stop))
    try:
        kv = await bus.kv()
        await wait_for(lambda: kv.keys("replica."), timeout=20, what="the replica's announcement")
        assert await kv.keys("replica.") == [replica_module.replica_key("gpu-host:4242")]
        assert r.replicas == 1
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
