"""Each team's 13-week utilization line with its target, in a real headless Chromium: on the live dashboard and in
the HTML report (`gpuevents report --weeks 13`); the points drawn are the rollups' weeks, the dashed target sits at
the team's target, and simulated usage is said."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpuevents.config import CostsConfig, GpuCost
from gpuevents.costs import CostModel
from rules.dashboard.fleet_view import FleetView
from rules.dashboard.pages import bound_port, serve_dashboard
from rules.dashboard.usage_source import UsageSource
from rules.usage.quarter import QuarterReport, build_quarter
from rules.usage.render_quarter import render_html
from rules.usage.rollup import HOUR, UsageAmounts, UsageBatch, UsageKey
from rules.usage.store import UsageStore
from tests.rules.dashboard.cdp import Chromium
from tests.waiting import wait_for

pytestmark = pytest.mark.slow  # every test drives a real Chromium

NOW = datetime(2026, 4, 14, 10, 30, tzinfo=UTC)
COSTS = CostModel(CostsConfig(energy_price_kwh=0, models={"H100": GpuCost(price=8760, depreciation_years=1)}))
TARGETS: dict[str, float | None] = {"nlp": 60.0, "vision": None}
ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"


def _nlp_util(week: int) -> float:
    return 19.0 + 3.25 * week  # 19 % in the first week, 58 % in the thirteenth


def _store(path: Path, simulated: bool) -> None:
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
            store.mark_simulated()


def _expected(path: Path) -> QuarterReport:
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


async def _until(browser: Chromium, expression: str, what: str) -> Any:
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
    top: box(svg).top, height: box(svg).height,
    target: target ? {y: box(target).top + box(target).height / 2, title: target.textContent,
                      dashed: getComputedStyle(target).strokeDasharray} : null,
  };
}"""


def _check_chart(chart: dict[str, Any], series_points: list[Any], target: float | None) -> None:
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
    if target is None:
        assert chart["target"] is None
    else:
        assert chart["target"] is not None and f"target {target:.0f} %" in chart["target"]["title"]
        assert chart["target"]["dashed"] not in ("", "none")
        if per_pct is not None:
            assert abs((zero - chart["target"]["y"]) - per_pct * target) < 1.5


@pytest.fixture
async def dashboard(tmp_path: Path) -> AsyncIterator[tuple[Chromium, Path]]:
    db = tmp_path / "usage.sqlite"
    _store(db, simulated=True)
    usage = UsageSource(db, COSTS, now=lambda: NOW, targets=TARGETS)
    runner = await serve_dashboard(NoFleet(), "127.0.0.1", 0, usage)  # type: ignore[arg-type]
    browser = Chromium(tmp_path / "profile")
    try:
        await browser.start(f"http://127.0.0.1:{bound_port(runner)}/?refresh=60000")
        yield browser, db
    finally:
        await browser.close()
        await runner.cleanup()


async def test_the_dashboard_draws_each_teams_13_weeks_against_its_target_and_says_they_are_simulated(
        dashboard: tuple[Chromium, Path]) -> None:
    browser, db = dashboard
    expected = _expected(db)
    await _until(browser, "document.querySelectorAll('.quarter-card svg circle').length > 0", "the quarter lines")
    chart = await browser.evaluate(f"({CHART % '.quarter-card'})('nlp')")
    assert chart["heading"] == "nlp"
    nlp = next(s for s in expected.teams if s.team == "nlp")
    assert nlp.change_text() == "19 % → 58 % in 13 weeks (target 60 %)"
    assert "19 % → 58 % in 13 weeks (target 60 %) · below target" in chart["text"]
    _check_chart(chart, nlp.points, 60.0)

    vision = next(s for s in expected.teams if s.team == "vision")
    chart = await browser.evaluate(f"({CHART % '.quarter-card'})('vision')")
    assert len(chart["points"]) == 12  # its unrecorded week is no point
    _check_chart(chart, vision.points, None)

    fleet = await browser.evaluate(f"({CHART % '.quarter-card'})('')")
    assert fleet["heading"] == "Fleet" and len(fleet["points"]) == 13
    _check_chart(fleet, expected.fleet.points, None)

    note = await browser.evaluate("(() => { const n = document.getElementById('quarter-simulated');"
                                  " return [n.hidden, n.getBoundingClientRect().height, n.textContent]; })()")
    assert note[0] is False and note[1] > 0 and "simulated" in note[2]
    await _until(browser, "!document.getElementById('timeline-simulated').hidden", "the heatmap's simulated note")
    ARTIFACTS.mkdir(exist_ok=True)
    await browser.evaluate("document.getElementById('quarter-section').scrollIntoView()")
    await browser.screenshot(ARTIFACTS / "dashboard-quarter.png")


async def test_the_html_report_draws_the_same_weeks_and_target_as_the_rollups_hold(tmp_path: Path) -> None:
    db = tmp_path / "usage.sqlite"
    _store(db, simulated=True)
    q = _expected(db).model_copy(update={"simulated": True})
    page = tmp_path / "quarter.html"
    page.write_text(render_html(q, COSTS))
    browser = Chromium(tmp_path / "profile")
    try:
        await browser.start(page.as_uri())
        await _until(browser, "document.querySelectorAll('svg circle').length > 0", "the report")
        cards = "[...document.querySelectorAll('.grid > div')].map((d) => (d.dataset.team = "
        cards += "d.querySelector('h2').textContent === 'Fleet' ? '' : d.querySelector('h2').textContent, d))"
        await browser.evaluate(f"({cards}).length")
        nlp = next(s for s in q.teams if s.team == "nlp")
        chart = await browser.evaluate(f"({CHART % '.grid > div'})('nlp')")
        assert "19 % → 58 % in 13 weeks (target 60 %)" in chart["text"] and "below target" in chart["text"]
        _check_chart(chart, nlp.points, 60.0)
        body = await browser.evaluate("document.body.innerText")
        assert "simulated" in json.dumps(body).lower()
    finally:
        await browser.close()
