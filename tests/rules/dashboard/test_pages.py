"""The dashboard's pages in a real headless Chromium: free GPUs, the heatmap over time and its hover, grouping,
filtering and search over many nodes, and the office wall view."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gpuevents.agentdata import GpuInfo, NodeInfo, NodeSnapshot
from gpuevents.config import CostsConfig, GpuCost
from gpuevents.costs import CostModel
from gpuevents.wire.fleet import FleetIncident
from gpuevents.wire.free import FreeQuery
from rules.dashboard.fleet_view import FleetView, fleet_view
from rules.dashboard.free import free_gpus
from rules.dashboard.pages import bound_port, serve_dashboard
from rules.dashboard.timeline import hour_window
from rules.dashboard.usage_source import UsageSource
from rules.usage.rollup import HOUR, UsageAmounts, UsageBatch, UsageKey
from rules.usage.store import UsageStore
from tests.rules.dashboard import quarterweeks as qw
from tests.rules.dashboard.cdp import Chromium
from tests.waiting import wait_for

pytestmark = pytest.mark.slow  # every test drives a real Chromium

NOW = datetime.now(UTC)
ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"
# an H100 costs 1 an hour; energy is free
COSTS = CostModel(CostsConfig(energy_price_kwh=0, models={"H100": GpuCost(price=8760, depreciation_years=1)}))
TEAMS = ("vision", "nlp", "speech")


def _gpu(node: str, index: int, state: str, owner: str | None = None, idle_for: float = 600.0) -> GpuInfo:
    busy = state == "busy"
    return GpuInfo(node=node, index=index, uuid=f"GPU-{node}-{index}", model="NVIDIA H100 80GB HBM3",
                   util_pct=85.0 if busy else 0.0, mem_used_mib=50000 if owner else 0, mem_total_mib=81559,
                   idle=not busy, idle_for_s=None if busy else idle_for,
                   pids=[100 + index] if owner else [], owner=owner)


class Fleet:
    """A stand-in for the engine: `nodes` nodes of four GPUs, teams by node label, changed by the tests."""

    def __init__(self, nodes: int) -> None:
        self.snaps: dict[str, NodeSnapshot] = {}
        for i in range(nodes):
            name = f"node-{i:02d}"
            gpus = [_gpu(name, g, "busy", f"user{i}") for g in range(3)] + [_gpu(name, 3, "idle", idle_for=60.0 * i)]
            self.put(name, gpus, team=TEAMS[i % 3], cluster=f"c{i % 2}")

    def put(self, name: str, gpus: list[GpuInfo], *, team: str, cluster: str = "c0", online: bool = True,
            cordoned: bool | None = None) -> None:
        self.snaps[name] = NodeSnapshot(node=NodeInfo(name=name, cluster=cluster, online=online, cordoned=cordoned,
                                                      labels={"team": team, "rack": f"r{len(self.snaps) % 4}"}),
                                        gpus=gpus)

    def hold(self, node: str, index: int, owner: str) -> None:
        snap = self.snaps[node]
        gpus = [_gpu(node, index, "idle", owner, 7200.0) if g.index == index else g for g in snap.gpus]
        self.snaps[node] = msgspec.structs.replace(snap, gpus=gpus)

    def fleet(self) -> FleetView:
        return fleet_view(self.snaps.values(), NOW, COSTS)

    def incidents(self) -> list[FleetIncident]:
        return []

    def recent_audit(self, limit: int) -> list[Any]:
        return []


def _usage(path: Path, fleet: Fleet) -> None:
    """24 hours of rollups: every GPU busy at 60 % by its node's user; node-00 GPU 3 held idle three quarters of
    the current hour by alice, at 12 % (the most wasteful row)."""
    first, end = hour_window(NOW, 24)
    batch = UsageBatch()
    for name, snap in fleet.snaps.items():
        for g in snap.gpus:
            for hour in range(first, end, HOUR):
                if (name, g.index, hour) == ("node-00", 3, end - HOUR):
                    amounts = UsageAmounts(model="NVIDIA H100", busy_s=900, held_s=2700, util_s=48 * 900,
                                           util_known_s=3600)
                    owner = "alice@example.com"
                else:
                    amounts = UsageAmounts(model="NVIDIA H100", busy_s=3600, util_s=60 * 3600, util_known_s=3600)
                    owner = f"user{int(name[-2:])}"
                batch.usage.append((UsageKey(hour, snap.node.cluster, name, g.index, owner,
                                             snap.node.labels["team"]), amounts))
    with UsageStore(path) as store:
        store.add(batch)


@dataclass
class Page:
    browser: Chromium
    fleet: Fleet
    base: str

    async def js(self, expression: str) -> Any:
        return await self.browser.evaluate(expression)

    async def text(self, selector: str) -> str | None:
        value = await self.js(f"(document.querySelector({json.dumps(selector)}) || {{}}).textContent")
        return value if isinstance(value, str) else None

    async def until(self, expression: str, what: str, timeout: float = 20) -> Any:
        """Wait until `expression` is truthy in the page (false while the page is still loading)."""
        guarded = f"(() => {{ try {{ return {expression}; }} catch (e) {{ return false; }} }})()"
        return await wait_for(lambda: self.js(guarded), timeout=timeout, interval=0.05, what=what)

    async def choose(self, select_id: str, value: str) -> None:
        await self.js(f"(() => {{ const s = document.getElementById({select_id!r}); s.value = {value!r};"
                      " s.dispatchEvent(new Event('change')); })()")


async def _open(tmp_path: Path, nodes: int, path: str) -> AsyncIterator[Page]:
    fleet = Fleet(nodes)
    _usage(tmp_path / "usage.sqlite", fleet)
    usage = UsageSource(tmp_path / "usage.sqlite", COSTS, now=lambda: NOW)  # the hours the rollups were written for
    runner = await serve_dashboard(fleet, "127.0.0.1", 0, usage)
    browser = Chromium(tmp_path / "profile")
    base = f"http://127.0.0.1:{bound_port(runner)}"
    try:
        await browser.start(base + path)
        yield Page(browser, fleet, base)
    finally:
        await browser.close()
        await runner.cleanup()


@pytest.fixture
async def small(tmp_path: Path) -> AsyncIterator[Page]:
    async for page in _open(tmp_path, 3, "/?refresh=200"):
        yield page


@pytest.fixture
async def many(tmp_path: Path) -> AsyncIterator[Page]:
    async for page in _open(tmp_path, 30, "/?refresh=200"):
        yield page


async def test_the_free_panel_shows_what_api_free_answers_and_follows_its_form(small: Page) -> None:
    small.fleet.hold("node-01", 3, "bob")  # no longer free
    small.fleet.put("node-09", [_gpu("node-09", 0, "idle", idle_for=99999)], team="vision", cordoned=True)
    expected = free_gpus(small.fleet.fleet(), FreeQuery(limit=20))
    lines = "\n".join(f"{n.node}: {n.env}" for n in expected.nodes)
    assert lines == ("node-02: CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=3\n"
                     "node-00: CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=3")
    await small.until(f"document.getElementById('free-env').textContent === {json.dumps(lines)}", "the free GPUs")
    assert await small.js("[...document.querySelectorAll('#free-table tbody tr')].map(r => r.dataset.gpu)") == [
        "node-02/3", "node-00/3"]
    assert await small.text("#free-count") == "2"
    summary = await small.text("#free-summary")
    assert summary is not None and "1 on cordoned nodes" in summary and "10 held by a process" in summary

    small.fleet.put("node-05", [_gpu("node-05", i, "idle") for i in range(2)], team="nlp")
    await small.js("(() => { const f = document.getElementById('free-form'); f.elements.count.value = '2';"
                   " f.requestSubmit(); })()")
    await small.until("document.getElementById('free-env').textContent === "
                      "'node-05: CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1'", "two GPUs on one node")


async def test_hovering_the_heatmap_tells_gpu_owner_utilization_and_cost(small: Page) -> None:
    await small.until("window.gpuevents.timings.firstTimelineMs !== null", "the heatmap")
    assert await small.js("document.querySelector('.timeline-canvas').dataset.rows") == "12"
    box = await small.js("(() => { const c = document.querySelector('.timeline-canvas'); c.scrollIntoView();"
                         " const r = c.getBoundingClientRect(); return [r.left, r.top, r.width]; })()")
    left, top, width = box
    cell_w = (width - 190 - 170) / 24
    x, y = left + 190 + 23.5 * cell_w, top + 18 + 8  # the first row (most wasteful), the current hour
    await small.browser.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
    await small.until("!document.querySelector('.timeline-tip').hidden", "the tooltip")
    tip = await small.text(".timeline-tip")
    assert tip is not None
    assert tip.startswith("c0:node-00/gpu3 · NVIDIA H100")  # two clusters: the label says which
    for part in ("owner: alice@example.com (team vision)", "utilization: 12 %", "held idle: 75 % of the hour",
                 "cost: $1.00 (held idle $0.75)"):
        assert part in tip, tip
    assert await small.js("document.querySelector('.timeline-tip').dataset.row") == "c0/node-00/3"
    ARTIFACTS.mkdir(exist_ok=True)
    await small.browser.screenshot(ARTIFACTS / "dashboard-heatmap-hover.png")
    await small.browser.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": 2, "y": 2})
    await small.until("document.querySelector('.timeline-tip').hidden", "the tooltip to go")


async def test_many_nodes_are_grouped_by_team_sorted_by_waste_filtered_and_searched(many: Page) -> None:
    for node, owner in (("node-01", "alice"), ("node-04", "alice"), ("node-07", "bob"), ("node-00", "carol")):
        many.fleet.hold(node, 3, owner)  # nlp holds three idle GPUs, vision one, speech none
    groups = "[...document.querySelectorAll('#groups tr.group-row')].map(r => r.dataset.group).join()"
    await many.until(f"{groups} === 'nlp,vision,speech'", "teams by waste")
    assert await many.js("document.getElementById('groups').dataset.mode") == "team"
    nlp = "document.querySelector('#groups tr.group-row[data-group=nlp]')"
    assert await many.js(f"[...{nlp}.cells].slice(1, 6).map(c => c.textContent).join('|')") == "40|30|10|3|$3.00"
    assert await many.js("document.querySelectorAll('.gpu').length") == 0  # a group shows no GPU until opened

    await many.js(f"{nlp}.querySelector('button').click()")
    await many.until("document.querySelectorAll('#groups tr.node-row').length === 10", "nlp's ten nodes")
    nodes = "[...document.querySelectorAll('#groups tr.node-row')].map(r => r.dataset.node)"
    assert (await many.js(nodes))[:3] == ["node-01", "node-04", "node-07"]  # held idle first
    assert await many.js("document.querySelector('[data-gpu=\"node-04/3\"]').dataset.state") == "held-idle"

    await many.choose("show", "held-idle")
    await many.until(f"{groups} === 'nlp,vision'", "only groups with held-idle GPUs")
    assert await many.text("#shown-count") == "4 of 30 nodes"
    search = ("(() => { const s = document.getElementById('search'); s.value = 'alice';"
              " s.dispatchEvent(new Event('input')); })()")
    await many.js(search)
    await many.until(f"{nodes}.join() === 'node-01,node-04'", "alice's two GPUs")

    await many.choose("show", "all")
    await many.js("(() => { const s = document.getElementById('search'); s.value = '';"
                  " s.dispatchEvent(new Event('input')); })()")
    await many.choose("group-by", "cluster")
    await many.until(f"{groups} === 'c0,c1'", "clusters")  # two held idle each (01, 07; 04, 00): by name
    await many.choose("group-by", "label:rack")
    await many.until(f"{groups}.split(',').sort().join() === 'r0,r1,r2,r3'", "racks")
    await many.choose("group-by", "node")
    await many.until("document.querySelectorAll('#groups tr.node-row').length === 30", "every node")
    await many.choose("sort-by", "name")
    assert (await many.js(nodes))[:3] == ["node-00", "node-01", "node-02"]
    await many.browser.screenshot(ARTIFACTS / "dashboard-grouped.png")


@pytest.mark.parametrize("path", ["/wall?refresh=200", "/?view=wall&refresh=200"])
async def test_the_wall_view_shows_big_numbers_teams_owners_and_the_last_day(tmp_path: Path, path: str) -> None:
    async for page in _open(tmp_path, 30, path):
        page.fleet.hold("node-01", 3, "alice")
        page.fleet.hold("node-04", 3, "alice")
        page.fleet.hold("node-02", 3, "bob")
        await page.until("document.body.classList.contains('wall')", "the wall page")
        await page.until("document.getElementById('held-idle-count').textContent === '3'", "three held idle")
        assert await page.text("#gpu-count") == "120"
        assert await page.text("#held-idle-cost") == "$3.00"
        assert await page.text("#free-count") == "27"
        assert await page.js("[...document.querySelectorAll('#board tbody tr')].map(r => r.dataset.group)") == [
            "nlp", "speech", "vision"]
        owners = ("[...document.querySelectorAll('#owners tbody tr')]"
                  ".map(r => r.dataset.owner + ':' + r.cells[1].textContent)")
        assert await page.js(owners) == ["alice:2", "bob:1"]
        await page.until("document.querySelector('.timeline-canvas').dataset.rows === '20'", "the last 24 hours")
        assert await page.js("document.querySelector('.legend .scale-ticks').textContent") == "0 %25 %50 %75 %100 %"
        await page.browser.send("Emulation.setDeviceMetricsOverride",
                                {"width": 1920, "height": 1080, "deviceScaleFactor": 1, "mobile": False})
        ARTIFACTS.mkdir(exist_ok=True)
        await page.browser.screenshot(ARTIFACTS / "dashboard-wall.png")


@pytest.fixture
async def quarter(tmp_path: Path) -> AsyncIterator[tuple[Chromium, Path]]:
    """The dashboard over 13 weeks of simulated rollups (no fleet now), targets from config."""
    db = tmp_path / "usage.sqlite"
    qw.write_quarter(db, simulated=True)
    usage = UsageSource(db, qw.COSTS, now=lambda: qw.NOW, targets=qw.TARGETS)
    runner = await serve_dashboard(qw.NoFleet(), "127.0.0.1", 0, usage)  # type: ignore[arg-type]
    browser = Chromium(tmp_path / "profile")
    try:
        await browser.start(f"http://127.0.0.1:{bound_port(runner)}/?refresh=60000")
        yield browser, db
    finally:
        await browser.close()
        await runner.cleanup()


async def test_each_teams_13_weeks_are_drawn_against_its_target_and_said_to_be_simulated(
        quarter: tuple[Chromium, Path]) -> None:
    browser, db = quarter
    expected = qw.expected_quarter(db)
    await qw.until(browser, "document.querySelectorAll('.quarter-card svg circle').length > 0", "the quarter lines")
    chart = await browser.evaluate(f"({qw.CHART % '.quarter-card'})('nlp')")
    assert chart["heading"] == "nlp"
    nlp = next(s for s in expected.teams if s.team == "nlp")
    assert nlp.change_text() == "19 % → 58 % in 13 weeks (target 60 %)"
    assert "19 % → 58 % in 13 weeks (target 60 %) · below target" in chart["text"]
    qw.check_chart(chart, nlp.points, 60.0)

    vision = next(s for s in expected.teams if s.team == "vision")
    chart = await browser.evaluate(f"({qw.CHART % '.quarter-card'})('vision')")
    assert len(chart["points"]) == 12  # its unrecorded week is no point
    qw.check_chart(chart, vision.points, None)

    fleet = await browser.evaluate(f"({qw.CHART % '.quarter-card'})('')")
    assert fleet["heading"] == "Fleet" and len(fleet["points"]) == 13
    qw.check_chart(fleet, expected.fleet.points, None)

    note = await browser.evaluate("(() => { const n = document.getElementById('quarter-simulated');"
                                  " return [n.hidden, n.getBoundingClientRect().height, n.textContent]; })()")
    assert note[0] is False and note[1] > 0 and "simulated" in note[2]
    await qw.until(browser, "!document.getElementById('timeline-simulated').hidden", "the heatmap's simulated note")
    ARTIFACTS.mkdir(exist_ok=True)
    await browser.evaluate("document.getElementById('quarter-section').scrollIntoView()")
    await browser.screenshot(ARTIFACTS / "dashboard-quarter.png")
    await browser.evaluate("window.location.href = '/wall'")  # the office screen says so too
    await qw.until(browser, "window.location.pathname === '/wall' && "
                   "!document.getElementById('timeline-simulated').hidden", "the wall's simulated note")


async def test_api_quarter_answers_the_rollups_weeks_and_checks_its_parameter(tmp_path: Path) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from rules.dashboard.pages import make_dashboard_app

    db = tmp_path / "usage.sqlite"
    qw.write_quarter(db, simulated=False)
    usage = UsageSource(db, qw.COSTS, now=lambda: qw.NOW, targets=qw.TARGETS)
    async with TestClient(TestServer(make_dashboard_app(qw.NoFleet(), usage))) as c:  # type: ignore[arg-type]
        r = await c.get("/api/quarter?weeks=13")
        assert r.status == 200
        body = await r.json()
        nlp = next(s for s in body["teams"] if s["team"] == "nlp")
        assert body["simulated"] is False and len(body["weeks"]) == 13
        assert nlp["change"] == "19 % → 58 % in 13 weeks (target 60 %)" and nlp["on_target"] is False
        assert [p["util_pct"] for p in nlp["points"]] == [
            p.util_pct for p in next(s for s in qw.expected_quarter(db).teams if s.team == "nlp").points]
        for bad in ("weeks=0", "weeks=54", "weeks=x"):
            r = await c.get(f"/api/quarter?{bad}")
            assert r.status == 400 and "weeks must be a whole number from 1 to 53" in await r.text()
    missing = UsageSource(tmp_path / "none.sqlite", qw.COSTS, now=lambda: qw.NOW, targets=qw.TARGETS)
    empty = await missing.quarter(13)
    assert empty.fleet.known == [] and [s.team for s in empty.teams] == ["nlp"]  # its target, no usage yet
    assert not (tmp_path / "none.sqlite").exists()  # reading never creates the file
    async with TestClient(TestServer(make_dashboard_app(qw.NoFleet()))) as c:  # type: ignore[arg-type]
        r = await c.get("/api/quarter")
        assert r.status == 404 and "no usage history" in await r.text()
