"""What glared or could not be read, looked at in a real headless Chromium: the wall's empty heatmap cells (hours
with no usage recorded) are dark on its black, and the label of a held-idle (hatched) GPU tile has a solid
backing, so its white text does not sit on white stripes. Screenshots go to test-artifacts/ to look at."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rules.dashboard.pages import bound_port, serve_dashboard
from rules.dashboard.timeline import hour_window
from rules.dashboard.usage_source import UsageSource
from rules.usage.rollup import HOUR, UsageAmounts, UsageBatch, UsageKey
from rules.usage.store import UsageStore
from tests.rules.dashboard.cdp import Chromium
from tests.rules.dashboard.test_pages import ARTIFACTS, COSTS, NOW, Fleet, Page

pytestmark = pytest.mark.slow  # every test drives a real Chromium

RECORDED_HOURS = 6  # of the last 24: the other 18 are empty cells


def _recent_usage(path: Path, fleet: Fleet) -> None:
    """Usage for the last six hours only, as after a short demo: most of the day's cells have no data."""
    _, end = hour_window(NOW, 24)
    batch = UsageBatch()
    for name, snap in fleet.snaps.items():
        for g in snap.gpus:
            for hour in range(end - RECORDED_HOURS * HOUR, end, HOUR):
                held = (name, g.index) == ("node-00", 3)
                amounts = UsageAmounts(model="NVIDIA H100", busy_s=900 if held else 3600, held_s=2700 if held else 0,
                                       util_s=(10 if held else 60) * 3600, util_known_s=3600)
                batch.usage.append((UsageKey(hour, snap.node.cluster, name, g.index, f"user{name[-2:]}",
                                             snap.node.labels["team"]), amounts))
    with UsageStore(path) as store:
        store.add(batch)


async def _open(tmp_path: Path, path: str) -> AsyncIterator[Page]:
    fleet = Fleet(6)
    fleet.hold("node-01", 0, "alice")
    fleet.hold("node-02", 2, "bob")
    _recent_usage(tmp_path / "usage.sqlite", fleet)
    runner = await serve_dashboard(fleet, "127.0.0.1", 0, UsageSource(tmp_path / "usage.sqlite", COSTS))
    browser = Chromium(tmp_path / "profile")
    base = f"http://127.0.0.1:{bound_port(runner)}"
    try:
        await browser.start(base + path)
        await browser.send("Emulation.setDeviceMetricsOverride",
                           {"width": 1920, "height": 1080, "deviceScaleFactor": 1, "mobile": False})
        yield Page(browser, fleet, base)
    finally:
        await browser.close()
        await runner.cleanup()


LUMINANCE = "((r, g, b) => 0.2126 * r + 0.7152 * g + 0.0722 * b)"


async def test_the_walls_empty_heatmap_cells_are_dark_not_light_grey(tmp_path: Path) -> None:
    async for page in _open(tmp_path, "/wall?refresh=200"):
        await page.until("document.querySelector('.timeline-canvas') && "
                         "document.querySelector('.timeline-canvas').dataset.rows > 0", "the last 24 hours")
        ARTIFACTS.mkdir(exist_ok=True)
        await page.browser.screenshot(ARTIFACTS / "wall-empty-cells.png")
        # the first hour of the first row has no usage: its centre pixel, and a recorded hour's, for comparison
        pixel = ("((x) => { const c = document.querySelector('.timeline-canvas');"
                 " const r = window.devicePixelRatio || 1, ctx = c.getContext('2d');"
                 " const p = ctx.getImageData(Math.round(x * r), Math.round((18 + 8) * r), 1, 1).data;"
                 f" return {LUMINANCE}(p[0], p[1], p[2]); }})")
        label_w = 220
        empty = await page.js(f"{pixel}({label_w + 5})")
        background = await page.js(f"(() => {{ const [r, g, b] = getComputedStyle(document.body).backgroundColor"
                                   f".match(/\\d+/g).map(Number); return {LUMINANCE}(r, g, b); }})()")
        assert empty < 60, f"an empty cell glares: luminance {empty:.0f} on a background of {background:.0f}"
        assert empty > background + 5, "an empty cell must still be told from the page around it"
        legend = await page.js("document.getElementById('timeline-legend').textContent")
        assert "no usage recorded" in legend


async def test_a_held_idle_tiles_label_has_a_solid_backing_on_its_stripes(tmp_path: Path) -> None:
    async for page in _open(tmp_path, "/?refresh=200"):
        await page.until("document.querySelectorAll('.gpu.held-idle').length === 2", "two held-idle tiles")
        ARTIFACTS.mkdir(exist_ok=True)
        await page.browser.screenshot(ARTIFACTS / "dashboard-held-tiles.png")
        box = await page.js("(() => { const r = document.querySelector('.gpu.held-idle').parentElement"
                            ".getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })()")
        zoom = await page.browser.send("Page.captureScreenshot", {"format": "png", "clip": {
            "x": box[0], "y": box[1], "width": box[2], "height": box[3], "scale": 4}})
        (ARTIFACTS / "dashboard-held-tiles-zoom.png").write_bytes(base64.b64decode(zoom["data"]))
        style = """(() => { const s = getComputedStyle(document.querySelector('.gpu.held-idle small'));
            return [s.backgroundColor, s.color]; })()"""
        back, colour = await page.js(style)
        parts = [float(x) for x in back[back.index("(") + 1:-1].split(",")]
        alpha = parts[3] if len(parts) == 4 else 1.0
        assert alpha >= 0.7, f"the label sits on the stripes: background {back}"
        assert sum(parts[:3]) / 3 < 60 and colour in ("rgb(255, 255, 255)", "rgb(248, 249, 250)"), (back, colour)
        assert await page.js("document.querySelector('.gpu.held-idle small').textContent") == "held"
