"""The KPI over many weeks written out: a self-contained HTML page (one inline SVG line per team, its target
dashed), Markdown and JSON; with a before/after comparison when one was asked for."""

from __future__ import annotations

import json

from markupsafe import Markup

from gpuevents.costs import CostModel
from rules.usage.html import render_template
from rules.usage.quarter import Comparison, QuarterReport, TeamSeries
from rules.usage.render import _CSS
from rules.usage.weekly import team_label

W, H, PAD = 360, 120, 28
SIMULATED = "Includes simulated usage (gpuevents simulate --history): not a real fleet's figures."
IMPORTED = "Includes hours imported from the site's history (gpuevents import), not recorded live."


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f} %"


def _name(team: str | None) -> str:
    return "Fleet" if team is None else team_label(team)


def _path(points: list[tuple[float, float | None]]) -> str:
    """An SVG path through the points, broken where a week has no reading (no line drawn across a gap)."""
    parts, pen = [], False
    for x, yy in points:
        if yy is None:
            pen = False
            continue
        parts.append(f"{'L' if pen else 'M'}{x:.1f},{yy:.1f}")
        pen = True
    return " ".join(parts) if sum(1 for p in parts if p[0] == "L") else ""


def line_svg(series: TeamSeries) -> str:
    """Utilization week by week (0-100 %) and the target as a dashed line."""
    n = max(len(series.points), 1)
    step = (W - 2 * PAD) / max(n - 1, 1)

    def y(pct: float) -> float:
        return H - PAD / 2 - (H - PAD) * max(0.0, min(pct, 100.0)) / 100.0

    pts = [(PAD + i * step, y(p.util_pct), p) for i, p in enumerate(series.points) if p.util_pct is not None]
    path = _path([(PAD + i * step, None if p.util_pct is None else y(p.util_pct)) for i, p in enumerate(series.points)])
    return render_template("line.svg.j2", series=series, name=_name, pct=_pct, w=W, h=H, pad=PAD, y=y, path=path,
                           points=pts)


def _comparison_rows(c: Comparison, costs: CostModel) -> list[tuple[str, str, str, str, str]]:
    rows = []
    for a, b in c.rows:
        change = ("–" if a.util_pct is None or b.util_pct is None else f"{b.util_pct - a.util_pct:+.0f} pts")
        rows.append((_name(a.team), _pct(a.util_pct), _pct(b.util_pct), change,
                     f"{costs.format(a.held_idle_cost)} → {costs.format(b.held_idle_cost)}"))
    return rows


def render_html(q: QuarterReport, costs: CostModel, comparison: Comparison | None = None) -> str:
    """The page (templates/quarter.html.j2): a chart per team, the weeks as a table, and the comparison if any."""
    page = render_template(
        "quarter.html.j2", q=q, css=Markup(_CSS), comparison=comparison,
        comparison_rows=_comparison_rows(comparison, costs) if comparison is not None else [],
        money=costs.format, pct=_pct, name=_name, simulated=SIMULATED, imported=IMPORTED,
        charts=[Markup(line_svg(s)) for s in q.lines()])
    return page + "\n"


def render_markdown(q: QuarterReport, costs: CostModel, comparison: Comparison | None = None) -> str:
    out = [f"# GPU utilization per team, {len(q.weeks)} weeks", "",
           f"{q.since:%Y-%m-%d} – {q.until:%Y-%m-%d}; utilization while held.", ""]
    if q.simulated:
        out += [f"**{SIMULATED}**", ""]
    if q.imported:
        out += [IMPORTED, ""]
    out += ["| team | utilization | target | held idle cost |", "| --- | --- | --- | --- |"]
    for s in q.lines():
        out.append(f"| {_name(s.team)} | {s.change_text()} | {_pct(s.target_util_pct)} | "
                   f"{costs.format(sum(p.held_idle_cost for p in s.points))} |")
    if comparison is not None:
        out += ["", "## Before and after", "", "| team | before | after | change | held idle cost |",
                "| --- | --- | --- | --- | --- |"]
        out += ["| " + " | ".join(row) + " |" for row in _comparison_rows(comparison, costs)]
    return "\n".join(out) + "\n"


def render_json(q: QuarterReport, comparison: Comparison | None = None) -> str:
    data = {"since": q.since.isoformat(), "until": q.until.isoformat(), "simulated": q.simulated,
            "imported": q.imported, "fleet": q.total.model_dump(), "quarter": json.loads(q.model_dump_json()),
            "comparison": json.loads(comparison.model_dump_json()) if comparison is not None else None}
    return json.dumps(data, indent=2) + "\n"


def render_quarter(q: QuarterReport, costs: CostModel, fmt: str, comparison: Comparison | None = None) -> str:
    if fmt == "json":
        return render_json(q, comparison)
    if fmt in ("md", "markdown"):
        return render_markdown(q, costs, comparison)
    return render_html(q, costs, comparison)
