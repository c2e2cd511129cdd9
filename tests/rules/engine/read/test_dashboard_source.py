"""The live dashboard over a running engine: its API answers from the engine's read model, the same JSON as a
FleetView's, in pages when asked."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gpuevents.bus import Bus
from gpuevents.clock import ManualClock
from gpuevents.config import Config
from gpuevents.costs import CostModel
from rules.dashboard.fleet_view import FleetView, fleet_view
from rules.dashboard.pages import bound_port, serve_dashboard
from rules.engine.read import readings
from rules.engine.read.dashboard_source import EngineDashboardSource
from rules.engine.service import Engine
from tests.rules.engine.conftest import T0, snapshot
from tests.rules.engine.helpers import publish, running
from tests.waiting import wait_for

NODES = [f"n{i}" for i in range(5)]


@pytest.fixture
async def dashboard(engine_config: Config, bus: Bus) -> AsyncIterator[tuple[Engine, str]]:
    async with running(await Engine.open(engine_config, bus, clock=ManualClock(T0))) as engine:
        await publish(bus, *(snapshot(n, T0, pid=None if n == "n3" else 4242) for n in NODES))
        await wait_for(lambda: len(engine.core.state.nodes) == len(NODES),
                       what="every node consumed")
        runner = await serve_dashboard(EngineDashboardSource(engine), "127.0.0.1", 0)
        try:
            yield engine, f"http://127.0.0.1:{bound_port(runner)}"
        finally:
            await runner.cleanup()


async def get(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(url) as r:
        assert r.status == 200, await r.text()
        got: dict[str, Any] = await r.json()
        return got


async def current(base: str) -> dict[str, Any]:
    """/api/fleet once it shows every node: the dashboard shares a read model up to two seconds old."""
    async def every_node() -> dict[str, Any] | None:
        got = await get(f"{base}/api/fleet")
        return got if got["total_nodes"] == len(NODES) else None
    return await wait_for(every_node, what="the dashboard showing every node")


async def test_the_fleet_is_the_json_of_a_fleet_view_and_comes_in_pages(dashboard: tuple[Engine, str]) -> None:
    engine, base = dashboard
    costs = CostModel(engine.config.costs)
    snaps = [readings.node_reading(engine.core, k) for k in readings.node_keys(engine.core)]
    expected = fleet_view([s for s in snaps if s is not None], T0, costs).model_dump(mode="json")
    got = await current(base)
    assert (got.pop("total_nodes"), got.pop("offset")) == (len(NODES), 0)
    for node in expected["nodes"]:  # the engine counts idle time from idle_since at the read model's time
        for g in node["gpus"]:
            g["idle_for_s"] = 0.0 if g["idle"] else None
    assert got == expected
    assert FleetView.model_validate(got).held_idle == len(NODES) - 1
    pages = [await get(f"{base}/api/fleet?offset={o}&limit=2") for o in (0, 2, 4)]
    assert [n["name"] for p in pages for n in p["nodes"]] == NODES
    assert {p["gpu_count"] for p in pages} == {len(NODES)}  # the counts are the whole fleet's on every page


async def test_free_and_incidents_come_from_the_read_model(dashboard: tuple[Engine, str]) -> None:
    _engine, base = dashboard
    await current(base)
    free = await get(f"{base}/api/free")
    assert [n["node"] for n in free["nodes"]] == ["n3"] and free["excluded"] == {"held": len(NODES) - 1}
    incidents = await get(f"{base}/api/incidents")
    assert incidents == {"incidents": []}  # idle-gpu-1h is pending for an hour: none firing yet
