"""The dashboard's JSON API, and its page in a real headless Chromium following a changing fleet."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpuevents.agentdata import GpuInfo, NodeInfo, NodeSnapshot
from gpuevents.config import CostsConfig
from gpuevents.costs import CostModel
from gpuevents.records import AuditRecord
from gpuevents.wire.fleet import FleetIncident
from rules.dashboard.fleet_view import FleetView, fleet_view
from rules.dashboard.pages import bound_port, make_dashboard_app, serve_dashboard
from tests.rules.dashboard.cdp import Chromium
from tests.waiting import wait_for

_Client = TestClient[web.Request, web.Application]

NOW = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"
COSTS = CostModel(CostsConfig.model_validate({
    "models": {"H100": {"price": 35040, "depreciation_years": 4, "rated_power_w": 700}}, "energy_price_kwh": 0.0}))


class FleetSource:
    """A stand-in for the engine: two nodes of eight busy GPUs, changed by the test."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeSnapshot] = {}
        for name in ("gpu-node-1", "gpu-node-2"):
            self.set_node(name, [GpuInfo(node=name, index=i, model="NVIDIA H100", util_pct=70 + i, pids=[100 + i],
                                         owner="alice@example.com") for i in range(8)])
        self.firing: list[FleetIncident] = []
        self.audit: list[AuditRecord] = [
            AuditRecord(time=NOW - timedelta(minutes=i), kind="action", rule="idle-gpu-2h",
                        entity_id=f"gpu-node-1/gpu{i}", action_type="slack", outcome="ok")
            for i in range(5)
        ]

    def set_node(self, name: str, gpus: list[GpuInfo], online: bool = True) -> None:
        self.nodes[name] = NodeSnapshot(node=NodeInfo(name=name, gpu_count=len(gpus), online=online), gpus=gpus)

    def make_held_idle(self, node: str, index: int) -> None:
        snap = self.nodes[node]
        gpus = [msgspec.structs.replace(g, util_pct=0.0, idle=True, idle_for_s=7300.0) if g.index == index else g
                for g in snap.gpus]
        self.set_node(node, gpus)

    def fleet(self) -> FleetView:
        return fleet_view(self.nodes.values(), NOW, COSTS)

    def incidents(self) -> list[FleetIncident]:
        return self.firing

    async def recent_audit(self, limit: int) -> list[AuditRecord]:  # an async source works too
        return self.audit[:limit]


@pytest.fixture
async def client() -> AsyncIterator[tuple[_Client, FleetSource]]:
    source = FleetSource()
    async with TestClient(TestServer(make_dashboard_app(source))) as c:
        yield c, source


def test_fleet_view_counts_held_idle_gpus_and_what_they_cost() -> None:
    source = FleetSource()
    source.make_held_idle("gpu-node-2", 3)
    view = source.fleet()
    assert (view.gpu_count, view.busy, view.idle, view.held_idle) == (16, 15, 1, 1)
    # 35040 / 4 / 365 = 24.00 a day = 1.00 an hour; energy is free here
    assert view.held_idle_cost_per_hour == pytest.approx(1.0)
    assert view.held_idle_cost_per_hour_text == "$1.00"


async def test_api_fleet_returns_the_fleet_model(client: tuple[_Client, FleetSource]) -> None:
    c, source = client
    source.make_held_idle("gpu-node-1", 0)
    r = await c.get("/api/fleet")
    assert r.status == 200
    assert r.headers["Cache-Control"] == "no-store"
    view = FleetView.model_validate(await r.json())
    assert view.gpu_count == 16
    assert [g.index for g in view.nodes[0].gpus if g.held_idle] == [0]
    assert (await r.json())["held_idle"] == 1


async def test_api_incidents_and_audit(client: tuple[_Client, FleetSource]) -> None:
    c, source = client
    source.firing = [FleetIncident(id="i1", rule="idle-gpu-2h", entity_id="gpu-node-1/gpu0", entity_kind="gpu",
                                  started_at=NOW, firing_since=NOW, cost="$2.00")]
    incidents = await (await c.get("/api/incidents")).json()
    assert [i["entity_id"] for i in incidents["incidents"]] == ["gpu-node-1/gpu0"]
    audit = await (await c.get("/api/audit?limit=2")).json()
    assert [a["entity_id"] for a in audit["records"]] == ["gpu-node-1/gpu0", "gpu-node-1/gpu1"]


@pytest.mark.parametrize("limit", ["0", "x", "100000"])
async def test_api_audit_rejects_a_bad_limit(client: tuple[_Client, FleetSource], limit: str) -> None:
    c, _ = client
    r = await c.get(f"/api/audit?limit={limit}")
    assert r.status == 400
    assert "limit must be" in await r.text()


async def test_a_failing_source_answers_500_not_a_traceback(client: tuple[_Client, FleetSource]) -> None:
    c, source = client
    source.nodes["bad"] = None  # type: ignore[assignment]  # a broken source on purpose
    r = await c.get("/api/fleet")
    assert r.status == 500
    assert (await r.json()) == {"error": "internal error; see the engine log"}


async def test_page_and_its_assets_are_served_with_a_strict_policy(client: tuple[_Client, FleetSource]) -> None:
    c, _ = client
    page = await c.get("/")
    assert page.status == 200
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    html = await page.text()
    assert 'src="/static/dashboard.js"' in html and "http" not in html
    for asset in ("/static/dashboard.js", "/static/dashboard.css"):
        assert (await c.get(asset)).status == 200


@pytest.mark.slow
async def test_dashboard_in_chromium_shows_the_fleet_and_follows_a_gpu_going_idle(tmp_path: Path) -> None:
    source = FleetSource()
    runner = await serve_dashboard(source, "127.0.0.1", 0)
    browser = Chromium(tmp_path / "profile")
    try:
        await browser.start(f"http://127.0.0.1:{bound_port(runner)}/?refresh=200")

        async def text(element_id: str) -> str | None:
            value = await browser.evaluate(
                f"(document.getElementById({element_id!r}) || {{}}).textContent")
            return value if isinstance(value, str) else None

        async def gpu_count_shown() -> bool:
            return await text("gpu-count") == "16"

        await wait_for(gpu_count_shown, timeout=30, interval=0.1, what="the page to show 16 GPUs")
        assert await text("held-idle-count") == "0"
        cells = await browser.evaluate("document.querySelectorAll('.gpu[data-state=busy]').length")
        assert cells == 16
        assert await browser.evaluate("document.querySelectorAll('#audit tbody tr').length") == 5
        marker = await browser.evaluate("window.__notReloaded = true")
        assert marker is True

        source.make_held_idle("gpu-node-2", 5)

        async def held_idle_shown() -> bool:
            return await text("held-idle-count") == "1"

        await wait_for(held_idle_shown, timeout=15, interval=0.1, what="the page to show one held-idle GPU")
        state = await browser.evaluate(
            "document.querySelector('[data-gpu=\"gpu-node-2/5\"]').dataset.state")
        assert state == "held-idle"
        assert await text("held-idle-cost") == "$1.00"
        assert await browser.evaluate("window.__notReloaded === true")  # polled, not reloaded
        await browser.screenshot(ARTIFACTS / "dashboard.png")
        assert (ARTIFACTS / "dashboard.png").stat().st_size > 1000
    finally:
        await browser.close()
        await runner.cleanup()
