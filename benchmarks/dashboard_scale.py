"""The live dashboard with a thousand nodes, in a real headless Chromium: time to first render, per update, per
search keystroke, and the 24-hour heatmap.

    python benchmarks/dashboard_scale.py [--nodes 1000] [--gpus 8] [--updates 8] [--json] [--screenshots DIR]

1. Builds a simulated fleet (`--nodes` × `--gpus`, four clusters, eight teams by node label, a few nodes offline,
   about a third of the GPUs idle and a tenth of those held idle) and 24 hours of usage rollups for every GPU in a
   SQLite store, as the engine writes them.
2. Serves the real dashboard app (rules/dashboard/pages.py) over that fleet; every GET /api/fleet moves
   about 5 % of the GPUs (utilization, idle, held) and rebuilds the fleet view, as the engine's state moves.
3. Opens `/?refresh=1500` in headless Chromium and reads the page's own timings (window.gpuevents.timings):
   - first render: from navigation start until the fleet is drawn (JSON fetched, parsed, grouped, in the DOM);
   - heatmap: from navigation start until the 24-hour heatmap is drawn;
   - update: each later poll, fetch + parse and render apart (median of `--updates`);
   - search: typing a node name into the search box until the table is redrawn (median of 5).
   Also GET /api/fleet and /api/timeline from Python (the server's part of an update) and the JSON sizes.
4. Does the same for one node (the baseline, in the same run) and prints each figure with its ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from gpuevents.agentdata import GpuInfo, NodeInfo, NodeSnapshot  # noqa: E402
from gpuevents.config import CostsConfig  # noqa: E402
from gpuevents.costs import CostModel  # noqa: E402
from gpuevents.wire.fleet import FleetIncident  # noqa: E402
from rules.dashboard.fleet_view import FleetView, fleet_view  # noqa: E402
from rules.dashboard.pages import bound_port, serve_dashboard  # noqa: E402
from rules.usage.rollup import HOUR, UsageAmounts, UsageBatch, UsageKey  # noqa: E402
from rules.usage.store import UsageStore  # noqa: E402
from tests.rules.dashboard.cdp import Chromium  # noqa: E402

TEAMS = ("vision", "nlp", "speech", "ranking", "ads", "infra", "research", "robotics")
USERS = tuple(f"user{i:03d}@example.com" for i in range(200))
COSTS = CostModel(CostsConfig())


class ScaleFleet:
    """A DashboardSource over `nodes` simulated nodes whose GPUs move on every read of the fleet."""

    def __init__(self, nodes: int, gpus: int, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.gpus = gpus
        self.snaps: dict[str, NodeSnapshot] = {}
        self.states: dict[str, list[tuple[float, bool, bool, str | None]]] = {}
        for i in range(nodes):
            name = f"gpu-{i:04d}"
            self.states[name] = [self._state() for _ in range(gpus)]
            self.snaps[name] = self._snapshot(name, i, online=self.rng.random() > 0.02)

    def _state(self) -> tuple[float, bool, bool, str | None]:
        r = self.rng.random()
        if r < 0.65:
            return (self.rng.uniform(40, 100), False, False, self.rng.choice(USERS))
        if r < 0.7:
            return (0.0, True, True, self.rng.choice(USERS))  # held idle
        return (self.rng.uniform(0, 3), True, False, None)

    def _snapshot(self, name: str, i: int, online: bool = True) -> NodeSnapshot:
        gpus = [GpuInfo(node=name, index=g, uuid=f"GPU-{name}-{g}", model="NVIDIA H100 80GB HBM3", util_pct=util,
                        mem_used_mib=60000 if owner else 0, mem_total_mib=81559, power_w=90 + 5 * util, idle=idle,
                        idle_for_s=3600.0 if idle else None, pids=[1000 + g] if owner else [], owner=owner)
                for g, (util, idle, _held, owner) in enumerate(self.states[name])]
        node = NodeInfo(name=name, cluster=f"c{i % 4}", online=online, gpu_count=self.gpus,
                        labels={"team": TEAMS[i % len(TEAMS)], "rack": f"r{i // 40:02d}"})
        return NodeSnapshot(node=node, gpus=gpus)

    def move(self, share: float = 0.05) -> None:
        names = list(self.snaps)
        for _ in range(max(1, int(len(names) * self.gpus * share))):
            name = self.rng.choice(names)
            self.states[name][self.rng.randrange(self.gpus)] = self._state()
            self.snaps[name] = self._snapshot(name, names.index(name), self.snaps[name].node.online)

    def fleet(self) -> FleetView:
        self.move()
        return fleet_view(self.snaps.values(), datetime.now(UTC), COSTS)

    def incidents(self) -> list[FleetIncident]:
        return []

    def recent_audit(self, limit: int) -> list[Any]:
        return []


def write_usage(path: Path, fleet: ScaleFleet, hours: int = 24, seed: int = 3) -> int:
    """Hourly rollups of the last `hours` hours for every GPU, as the engine writes them."""
    rng = random.Random(seed)
    end = int(time.time()) // HOUR * HOUR + HOUR
    batch = UsageBatch()
    for name, snap in fleet.snaps.items():
        for g in range(fleet.gpus):
            for h in range(hours):
                busy = rng.uniform(0, HOUR)
                held = rng.uniform(0, HOUR - busy) if rng.random() < 0.3 else 0.0
                owner = rng.choice(USERS)
                batch.usage.append((UsageKey(end - (hours - h) * HOUR, snap.node.cluster, name, g, owner,
                                             snap.node.labels["team"]),
                                    UsageAmounts(model="NVIDIA H100 80GB HBM3", busy_s=busy, held_s=held,
                                                 free_s=HOUR - busy - held, util_s=busy * 80, util_known_s=HOUR,
                                                 busy_kwh=busy * 0.4 / HOUR, held_kwh=held * 0.1 / HOUR,
                                                 free_kwh=(HOUR - busy - held) * 0.07 / HOUR)))
    with UsageStore(path) as store:
        store.add(batch)
    return len(batch.usage)


async def _timings(browser: Chromium, updates: int, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        t = await browser.evaluate("JSON.stringify(window.gpuevents && window.gpuevents.timings)")
        data: dict[str, Any] | None = json.loads(t) if t and t != "null" else None
        if data and data["firstFleetMs"] is not None and data["firstTimelineMs"] is not None \
                and len(data["updates"]) >= updates:
            return data
        if time.monotonic() > deadline:
            raise TimeoutError(f"the page did not report its timings in {timeout:.0f} s: {data}")
        await asyncio.sleep(0.1)


async def _search_ms(browser: Chromium, needle: str) -> float:
    return float(await browser.evaluate(
        "(() => { const s = document.getElementById('search'); const t = performance.now();"
        f" s.value = {json.dumps(needle)}; s.dispatchEvent(new Event('input'));"
        " const d = performance.now() - t; s.value = ''; s.dispatchEvent(new Event('input')); return d; })()"))


async def measure(nodes: int, gpus: int, updates: int, work: Path, shots: Path | None) -> dict[str, Any]:
    from rules.dashboard.usage_source import UsageSource

    fleet = ScaleFleet(nodes, gpus)
    db = work / f"usage-{nodes}.sqlite"
    rows = write_usage(db, fleet)
    runner = await serve_dashboard(fleet, "127.0.0.1", 0, UsageSource(db, COSTS))
    base = f"http://127.0.0.1:{bound_port(runner)}"
    out: dict[str, Any] = {"nodes": nodes, "gpus": nodes * gpus, "usage_rows": rows}
    try:
        async with aiohttp.ClientSession() as http:
            for name, path in (("api_fleet", "/api/fleet"), ("api_timeline", "/api/timeline?hours=24&limit=300")):
                times, size = [], 0
                for _ in range(3):
                    t = time.perf_counter()
                    async with http.get(base + path) as r:
                        size = len(await r.read())
                    times.append((time.perf_counter() - t) * 1000)
                out[f"{name}_ms"] = statistics.median(times)
                out[f"{name}_bytes"] = size
        browser = Chromium(work / f"profile-{nodes}")
        try:
            await browser.start(f"{base}/?refresh=1500")
            timings = await _timings(browser, updates, timeout=120 + updates * 10)
            out["first_render_ms"] = timings["firstFleetMs"]
            out["first_heatmap_ms"] = timings["firstTimelineMs"]
            out["update_fetch_ms"] = statistics.median(u["fetchMs"] for u in timings["updates"])
            out["update_render_ms"] = statistics.median(u["renderMs"] for u in timings["updates"])
            out["update_render_max_ms"] = max(u["renderMs"] for u in timings["updates"])
            out["search_ms"] = statistics.median([await _search_ms(browser, f"gpu-{i:04d}") for i in range(5)])
            out["dom_elements"] = await browser.evaluate("document.getElementsByTagName('*').length")
            if shots is not None:
                await browser.screenshot(shots / f"dashboard-{nodes}.png")
        finally:
            await browser.close()
    finally:
        await runner.cleanup()
    return out


FIGURES = (("first_render_ms", "first render (navigation → fleet drawn)"),
           ("first_heatmap_ms", "first 24-hour heatmap drawn"),
           ("update_fetch_ms", "update: fetch + parse (median)"),
           ("update_render_ms", "update: render (median)"),
           ("update_render_max_ms", "update: render (worst)"),
           ("search_ms", "search keystroke → table redrawn"),
           ("api_fleet_ms", "GET /api/fleet, server + transfer"),
           ("api_timeline_ms", "GET /api/timeline (24 h)"),
           ("dom_elements", "elements in the page"))


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--updates", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--screenshots", type=Path, help="save a screenshot of each page here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        baseline = await measure(1, args.gpus, args.updates, work, args.screenshots)
        scaled = await measure(args.nodes, args.gpus, args.updates, work, args.screenshots)
    if args.json:
        print(json.dumps({"baseline": baseline, "scaled": scaled}, indent=2))
        return
    print(f"dashboard, {scaled['nodes']} nodes × {args.gpus} GPUs ({scaled['gpus']} GPUs, {scaled['usage_rows']} "
          f"hourly rollup rows) against 1 node × {args.gpus} GPUs, headless Chromium")
    print(f"  JSON: /api/fleet {scaled['api_fleet_bytes'] / 1e6:.2f} MB, /api/timeline "
          f"{scaled['api_timeline_bytes'] / 1e6:.2f} MB")
    print(f"  {'figure':44} {'1 node':>10} {args.nodes:>7} nodes {'ratio':>7}")
    for key, text in FIGURES:
        a, b = baseline[key], scaled[key]
        unit = "" if key == "dom_elements" else " ms"
        print(f"  {text:44} {a:>8.1f}{unit:3} {b:>10.1f}{unit:3} {b / a if a else float('nan'):>6.1f}×")


if __name__ == "__main__":
    asyncio.run(main())
