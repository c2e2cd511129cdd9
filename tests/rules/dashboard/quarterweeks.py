"""Thirteen weeks of rollups (nlp rising 19 % → 58 %, vision flat with a missing week) and the checks of a page
that draws them: its points are the rollups' weeks, higher utilization drawn higher, the dashed target where its
percentage is. For the dashboard's and the HTML report's browser tests."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuevents.config import CostsConfig, GpuCost
from gpuevents.costs import CostModel
from rules.dashboard.fleet_view import FleetView
from rules.usage.quarter import QuarterReport, build_quarter
from rules.usage.rollup import HOUR, UsageAmounts, UsageBatch, UsageKey
from rules.usage.store import SIMULATED, UsageStore
from tests.rules.dashboard.cdp import Chromium
from tests.waiting import wait_for

NOW = datetime(2026, 4, 14, 10, 30, tzinfo=UTC)
COSTS = CostModel(CostsConfig(energy_price_kwh=0, models={"H100": GpuCost(price=8760, depreciation_years=1)}))
TARGETS: dict[str, float | None] = {"nlp": 60.0, "vision": None}


def _nlp_util(week: int) -> float:
    return 19.0 + 3.25 * week  # 19 % in the first week, 58 % in the thirteenth


def write_quarter(path: Path, simulated: bool) -> None:
    """13 weeks of rollups: nlp's two GPUs rising 19 % → 58 %, vision's flat at 45 %; one held hour a day each,
    week 5 of vision unrecorded (a gap in its line)."""
    end = int(NOW.timestamp()) // HOUR * HOUR + HOUR
    start = end - 13 * 7 * 24 * HOUR
    batch = UsageBatch()
    for day in range(13 * 7):
        hour = start + day * 24 * HOUR + 10 * HOUR
        week = day // 7
        for team, node, util in (("nlp", "n1", _nlp_util(week)), ("nlp", "n2", _nlp_util(week)),
                                 ("vision", "v1", 45.0)):
            if team == "vision" and week == 5:
                continue
            amounts = UsageAmounts(model="NVIDIA H100", busy_s=3600 * util / 100, held_s=3600 * (1 - util / 100),
                                   util_s=util * 3600, util_known_s=3600)
            batch.usage.append((UsageKey(hour, "c0", node, 0, f"{team}-user", team), amounts))
    with UsageStore(path) as store:
        store.add(batch)
        if simulated:
            store.mark_origin({(k.hour, k.cluster, k.node) for k, _ in batch.usage}, SIMULATED)


def expected_quarter(path: Path) -> QuarterReport:
    end = int(NOW.timestamp()) // HOUR * HOUR + HOUR
    first = end - 13 * 7 * 24 * HOUR
    with UsageStore(path) as store:
        rows = store.usage(first, end)
    return build_quarter(rows, COSTS, datetime.fromtimestamp(first, UTC), datetime.fromtimestamp(end, UTC), TARGETS)


class NoFleet:
    def fleet(self) -> FleetView:
        return FleetView(time=NOW)

    def incidents(self) -> list[object]:
        return []

    def recent_audit(self, limit: int) -> list[object]:
        return []


async def until(browser: Chromium, expression: str, what: str) -> Any:
    guarded = f"(() => {{ try {{ return {expression}; }} catch (e) {{ return false; }} }})()"
    return await wait_for(lambda: browser.evaluate(guarded), timeout=20, interval=0.05, what=what)


CHART = """(team) => {
  const card = [...document.querySelectorAll('%s')].find((c) => c.dataset.team === team);
  const svg = card.querySelector('svg');
  const box = (e) => e.getBoundingClientRect();
  const target = svg.querySelector('line[data-target], line[stroke-dasharray]');
  return {
    heading: card.querySelector('h2, h3').textContent,
    text: card.textContent,
    points: [...svg.querySelectorAll('circle')].map((c) => ({
      title: c.querySelector('title').textContent, y: box(c).top + box(c).height / 2,
      visible: box(c).width > 0 && getComputedStyle(c).visibility !== 'hidden'})),
    zero: box(svg.querySelector('line')).top,
    path: (svg.querySelector('path') || {getAttribute: () => ''}).getAttribute('d'),
    top: box(svg).top, height: box(svg).height,
    target: target ? {y: box(target).top + box(target).height / 2, title: target.textContent,
                      dashed: getComputedStyle(target).strokeDasharray} : null,
  };
}"""


def check_chart(chart: dict[str, Any], series_points: list[Any], target: float | None) -> None:
    """The circles are the weeks the rollups hold, in order, with their utilization; higher utilization is drawn
    higher; the target line sits where its percentage does on the same scale."""
    known = [p for p in series_points if p.util_pct is not None]
    assert [c["title"].split(":")[0] for c in chart["points"]] == [f"week of {p.week_start:%Y-%m-%d}" for p in known]
    shown = [float(c["title"].split(": ")[1].split(" %")[0]) for c in chart["points"]]
    assert all(abs(v - p.util_pct) <= 0.5 for v, p in zip(shown, known, strict=True)), shown  # rounded to 1 %
    assert all(c["visible"] for c in chart["points"])
    ys = [c["y"] for c in chart["points"]]
    zero = chart["zero"]
    # the y of a point is linear in its utilization: find the scale from the first and last, check all
    first, last = known[0].util_pct, known[-1].util_pct
    per_pct = (ys[0] - ys[-1]) / (last - first) if last != first else None
    if per_pct is not None:
        assert per_pct > 0  # more utilization, higher on the screen
        for c, p in zip(chart["points"], known, strict=True):
            assert abs((zero - c["y"]) - per_pct * p.util_pct) < 1.5, (c, p)
    # one stroke per run of recorded weeks: a week without readings is a gap, not a line across it
    runs = sum(1 for i, p in enumerate(series_points)
               if p.util_pct is not None and (i == 0 or series_points[i - 1].util_pct is None))
    assert chart["path"].count("M") == runs and chart["path"].count("L") == len(known) - runs
    if target is None:
        assert chart["target"] is None
    else:
        assert chart["target"] is not None and f"target {target:.0f} %" in chart["target"]["title"]
        assert chart["target"]["dashed"] not in ("", "none")
        if per_pct is not None:
            assert abs((zero - chart["target"]["y"]) - per_pct * target) < 1.5


