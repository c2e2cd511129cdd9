"""The KPI report over many weeks as HTML, in a real headless Chromium: each team's line is the rollups' weeks,
its target dashed at the target's height, the change said, and simulated usage marked."""

from __future__ import annotations

from pathlib import Path

import pytest

from rules.usage.render_quarter import render_html
from tests.rules.dashboard import quarterweeks as qw
from tests.rules.dashboard.cdp import Chromium

pytestmark = pytest.mark.slow  # drives a real Chromium


async def test_the_html_report_draws_the_same_weeks_and_target_as_the_rollups_hold(tmp_path: Path) -> None:
    db = tmp_path / "usage.sqlite"
    qw.write_quarter(db, simulated=True)
    q = qw.expected_quarter(db).model_copy(update={"simulated": True})
    page = tmp_path / "quarter.html"
    page.write_text(render_html(q, qw.COSTS))
    browser = Chromium(tmp_path / "profile")
    try:
        await browser.start(page.as_uri())
        await qw.until(browser, "document.querySelectorAll('svg circle').length > 0", "the report")
        name = "d.querySelector('h2').textContent"
        await browser.evaluate("[...document.querySelectorAll('.grid > div')].forEach((d) => {"
                               f" d.dataset.team = {name} === 'Fleet' ? '' : {name}; }})")
        nlp = next(s for s in q.teams if s.team == "nlp")
        chart = await browser.evaluate(f"({qw.CHART % '.grid > div'})('nlp')")
        assert "19 % → 58 % in 13 weeks (target 60 %)" in chart["text"] and "below target" in chart["text"]
        qw.check_chart(chart, nlp.points, 60.0)
        fleet = await browser.evaluate(f"({qw.CHART % '.grid > div'})('')")
        qw.check_chart(fleet, q.fleet.points, None)
        vision = next(s for s in q.teams if s.team == "vision")
        chart = await browser.evaluate(f"({qw.CHART % '.grid > div'})('vision')")
        qw.check_chart(chart, vision.points, None)  # its unrecorded week breaks its line
        body = await browser.evaluate("document.body.innerText")
        assert "Includes simulated usage (gpuevents simulate --history)" in body
    finally:
        await browser.close()
