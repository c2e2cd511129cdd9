"""`gpuevents agent` and `gpuevents simulate` from the command line."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nats.js import JetStreamContext
from typer.testing import CliRunner

from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.cli import app
from gpuevents.config import NatsConfig
from gpuevents.events import SnapshotEvent, decode_event
from gpuevents.server import EmbeddedServer

runner = CliRunner()


def test_agent_without_nvml_says_so_and_exits_1(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("nats: {url: 'nats://127.0.0.1:9'}\n")
    result = runner.invoke(app, ["agent", "-c", str(cfg)])
    assert result.exit_code == 1
    assert "NVML is not available" in result.output and "--simulate" in result.output


def test_simulate_with_an_unknown_scenario_lists_the_shipped_ones() -> None:
    result = runner.invoke(app, ["simulate", "--scenario", "nope", "--for", "1s"])
    assert result.exit_code == 1 and "shipped: a100-mig, demo" in result.output


async def test_simulate_creates_no_stream(nats_server: EmbeddedServer, jetstream: JetStreamContext,
                                         tmp_path: Path) -> None:
    """Only the engine (or an admin's setup) creates streams: a simulated fleet before any engine makes none
    (DESIGN §9)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"nats: {{url: '{nats_server.url}'}}\nagent: {{sample_interval: 0.2s, snapshot_interval: 0.5s}}\n")
    result = await asyncio.to_thread(runner.invoke, app, ["simulate", "-c", str(cfg), "--nodes", "1", "--for", "1s"])
    assert result.exit_code == 0, result.output
    assert await jetstream.streams_info() == []


def test_simulate_publishes_snapshots_of_every_node(nats_server: EmbeddedServer, tmp_path: Path) -> None:
    async def setup() -> None:  # the engine's, before the agents
        async with Bus(NatsConfig(url=nats_server.url)) as bus:
            await bus.ensure_streams()
    asyncio.run(setup())
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"cluster: lab\nnats: {{url: '{nats_server.url}'}}\n"
                   "agent: {sample_interval: 0.2s, snapshot_interval: 0.5s}\n")
    result = runner.invoke(app, ["simulate", "-c", str(cfg), "--nodes", "5", "--gpus-per-node", "2",
                                 "--scenario", "mixed", "--for", "2s"])
    assert result.exit_code == 0, result.output
    assert "Simulating 5 node(s) x 2 GPU(s)" in result.output

    async def snapshots() -> list[SnapshotEvent]:
        bus = Bus(NatsConfig(url=nats_server.url))
        await bus.connect()
        try:
            events = [decode_event(m.data) async for m in bus.replay(S.STREAM_EVENTS, S.EVENTS_ALL)]
        finally:
            await bus.close()
        return [e for e in events if isinstance(e, SnapshotEvent)]

    snaps = asyncio.run(snapshots())
    assert {s.node for s in snaps} == {f"sim-{i:03d}" for i in range(5)}
    assert all(s.cluster == "lab" and s.data.node.gpu_count == 2 for s in snaps)


def test_free_names_skip_those_in_use() -> None:
    from gpuevents.cli.agent import free_name, free_prefix

    assert free_name("vm-sim", set()) == "vm-sim"
    assert free_name("vm-sim", {"vm", "vm-sim", "vm-sim-2"}) == "vm-sim-3"
    assert free_prefix("sim-", {"vm"}) == "sim-"
    assert free_prefix("sim-", {"sim-000", "sim2-000"}) == "sim3-"
