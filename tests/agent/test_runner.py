"""Agents against a real nats-server: snapshots and threshold events with the normative fields,
kill over request/reply, and no threshold event lost across a NATS restart."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import orjson

from agent.runner import run_agent, run_simulated_fleet, simulated_agents
from agent.scenario import Scenario
from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.commands import KillCommand, KillReply
from gpuevents.config import AgentConfig, Config, NatsConfig, ProtectConfig
from gpuevents.events import Event, GpuEvent, ProcessEvent, SnapshotEvent, decode_event
from gpuevents.server import EmbeddedServer
from tests.waiting import wait_for

ENVELOPE = {"specversion", "id", "type", "source", "cluster", "time", "data"}
NODE = {"name", "cluster", "labels", "gpu_count", "gpus_busy", "gpus_idle", "online", "last_seen",
        "cordoned", "driver_version"}
GPU = {"node", "index", "uuid", "model", "util_pct", "mem_used_mib", "mem_total_mib", "mem_pct",
       "temp_c", "power_w", "power_limit_w", "fan_pct", "ecc_uncorrected", "idle", "idle_since",
       "idle_for_s", "pids", "owners", "owner", "mig_parent"}
PROCESS = {"node", "pid", "name", "cmdline", "user", "uid", "owner", "create_time", "age_s", "gpus",
           "gpu_mem_mib", "gpu_util_pct", "container_id", "pod", "labels"}

CHURN = Scenario.model_validate({
    "name": "churn", "gap": ["0.3s", "0.8s"], "busy_at_start": 0.5,
    "jobs": [{"kind": "training", "duration": ["0.5s", "1.5s"], "util_pct": [80, 99], "mem_pct": [95, 99]},
             {"kind": "idle_holder", "duration": ["0.5s", "1.5s"], "util_pct": 0, "mem_pct": 30}],
})


def config(nats: NatsConfig, **agent: Any) -> Config:
    a = {"node_name": "n1", "sample_interval": 0.1, "snapshot_interval": 0.5, "labels": {"env": "test"}}
    a.update(agent)
    return Config(cluster="c1", nats=nats, agent=AgentConfig(**a), protect=ProtectConfig(users=[]),
                  owners={"alice": "alice@example.com"})


async def stored(bus: Bus) -> list[tuple[dict[str, Any], Event]]:
    out = []
    async for m in bus.replay(S.STREAM_EVENTS, S.EVENTS_ALL):
        out.append((orjson.loads(m.data), decode_event(m.data)))
    return out


async def test_fleet_snapshots_carry_every_normative_field(bus: Bus, nats_config: NatsConfig) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(run_simulated_fleet(config(nats_config), bus, 3, 4, "demo", stop))

    async def snapshot_nodes() -> set[str]:
        return {e.node for _, e in await stored(bus) if e.type == "node.snapshot"}

    async def every_node_snapshotted() -> bool:
        return len(await snapshot_nodes()) == 3

    await wait_for(every_node_snapshotted, timeout=20, what="a snapshot from each node")
    stop.set()
    await task
    assert await bus.flush(5)
    events = await stored(bus)
    snaps = [(raw, e) for raw, e in events if e.type == "node.snapshot"]
    assert {e.node for _, e in snaps} == {"sim-000", "sim-001", "sim-002"}
    for raw, e in snaps:
        assert ENVELOPE <= set(raw) and raw["cluster"] == "c1" and raw["source"] == f"node/{e.node}"
        assert NODE <= set(raw["data"]["node"])
        assert raw["data"]["node"]["gpu_count"] == 4 and raw["data"]["node"]["labels"] == {"env": "test"}
        for g in raw["data"]["gpus"]:
            assert GPU <= set(g)
        assert raw["data"]["processes"]
        for p in raw["data"]["processes"]:
            assert PROCESS <= set(p)
    types = {e.type for _, e in events}
    assert {"agent.started", "agent.stopping", "gpu.idle", "process.started"} <= types
    idle = next(raw for raw, e in events if e.type == "gpu.idle" and raw["data"]["index"] == 0)
    assert GPU <= set(idle["data"]) and idle["data"]["owner"] == "alice@example.com"
    started = next(raw for raw, e in events if e.type == "process.started")
    assert PROCESS <= set(started["data"])


async def test_kill_over_nats(bus: Bus, nats_config: NatsConfig) -> None:
    cfg = config(nats_config)
    (agent_sampler,) = [a.sampler for a in simulated_agents(
        cfg, nodes=1, gpus_per_node=4, scenario="demo", start=_now())]
    stop = asyncio.Event()
    task = asyncio.create_task(run_agent(cfg, bus, sampler=agent_sampler, stop_event=stop))

    async def idle_event() -> GpuEvent | None:
        for _, e in await stored(bus):
            if isinstance(e, GpuEvent) and e.type == "gpu.idle" and e.data.index == 0:
                return e
        return None

    idle = await wait_for(idle_event, timeout=20, what="gpu.idle for GPU 0")
    snap = next(e for _, e in await stored(bus) if isinstance(e, SnapshotEvent))
    pid = idle.data.pids[0]
    proc = next(p for p in snap.data.processes if p.pid == pid)
    subject = S.command_subject("c1", "n1", "kill")
    wrong = KillCommand(pid=pid, create_time=proc.create_time.replace(year=2020), grace_s=1)
    reply = KillReply.model_validate_json(await _request(bus, subject, wrong))
    assert reply.outcome == "refused"
    cmd = KillCommand(pid=pid, create_time=proc.create_time, grace_s=2, rule="idle", key="k1")
    reply = KillReply.model_validate_json(await _request(bus, subject, cmd))
    assert (reply.outcome, reply.user) == ("exited", "alice")

    async def ended() -> bool:
        return any(isinstance(e, ProcessEvent) and e.type == "process.ended" and e.data.pid == pid
                   for _, e in await stored(bus))

    await wait_for(ended, timeout=10, what="process.ended after the kill")
    stop.set()
    await task


async def _request(bus: Bus, subject: str, cmd: KillCommand) -> bytes:
    async def answered() -> bytes | None:
        try:
            return await bus.request(subject, cmd.model_dump_json().encode(), timeout=5)
        except Exception:  # no responder yet: the agent subscribes once connected
            return None

    return await wait_for(answered, timeout=10, what="a kill reply")


def _now() -> datetime:
    return datetime.now(UTC)


class RecordingBus:
    """The real bus, remembering every event the agent handed it."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.sent: list[Event] = []

    @property
    def connected(self) -> bool:
        return self.bus.connected

    def publish_event(self, event: Event) -> None:
        self.sent.append(event)
        self.bus.publish_event(event)

    async def serve(self, *a: Any, **kw: Any) -> Any:
        return await self.bus.serve(*a, **kw)


async def test_nats_restart_loses_no_threshold_event(nats_server: EmbeddedServer, nats_config: NatsConfig) -> None:
    bus = Bus(nats_config, name="agent-n1")
    await bus.connect()
    await bus.ensure_streams()
    rec = RecordingBus(bus)
    cfg = config(nats_config)
    (sampler,) = [a.sampler for a in simulated_agents(cfg, nodes=1, gpus_per_node=4, scenario=CHURN, start=_now())]
    stop = asyncio.Event()
    task = asyncio.create_task(run_agent(cfg, rec, sampler=sampler, stop_event=stop))
    threshold = ("gpu.", "process.")

    def count() -> int:
        return sum(1 for e in rec.sent if e.type.startswith(threshold))

    await wait_for(lambda: count() >= 5, timeout=20, what="threshold events before the outage")
    nats_server.stop()
    await wait_for(lambda: not bus.connected, timeout=10, what="the agent to notice the outage")
    during = count()
    await wait_for(lambda: count() >= during + 10, timeout=20, what="sampling to go on during the outage")
    assert bus.stats.buffered > 0
    nats_server.start()
    await wait_for(lambda: bus.connected, timeout=20, what="reconnection")
    after = count()
    await wait_for(lambda: count() >= after + 3, timeout=20, what="events after the restart")
    stop.set()
    await task
    assert await bus.flush(20), f"buffer not drained: {bus.stats}"
    ids = {e.id for _, e in await stored(bus)}
    await bus.close()
    sent = [e for e in rec.sent if e.type.startswith(threshold)]
    missing = [(e.type, e.time) for e in sent if e.id not in ids]
    assert not missing, f"{len(missing)} of {len(sent)} threshold events lost: {missing[:5]}"
    assert {"gpu.idle", "gpu.active", "process.started", "process.ended"} <= {e.type for e in sent}
    assert bus.stats.dropped == 0
