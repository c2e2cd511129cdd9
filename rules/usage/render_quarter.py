"""The KPI over many weeks written out: a self-contained HTML page (one inline SVG line per team, its target
dashed), Markdown and JSON; with a before/after comparison when one was asked for."""

from __future__ import annotations

import json
from html import escape

from gpuevents.costs import CostModel
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

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" '
           f'aria-label="{escape(_name(series.team))}: utilization per week" font-size="10">',
           f'<line x1="{PAD}" y1="{y(0):.1f}" x2="{W - PAD}" y2="{y(0):.1f}" stroke="#adb5bd"/>',
           f'<text x="2" y="{y(0):.1f}">0</text><text x="2" y="{y(100) + 4:.1f}">100</text>']
    if series.target_util_pct is not None:
        ty = y(series.target_util_pct)
        out.append(f'<line x1="{PAD}" y1="{ty:.1f}" x2="{W - PAD}" y2="{ty:.1f}" stroke="#1b6e3a" '
                   f'stroke-dasharray="4 3"><title>target {series.target_util_pct:.0f} %</title></line>')
    pts = [(PAD + i * step, y(p.util_pct), p) for i, p in enumerate(series.points) if p.util_pct is not None]
    path = _path([(PAD + i * step, None if p.util_pct is None else y(p.util_pct)) for i, p in enumerate(series.points)])
    if path:
        out.append(f'<path d="{path}" fill="none" stroke="#3b528b" stroke-width="2"/>')
    for x, yy, p in pts:
        out.append(f'<circle cx="{x:.1f}" cy="{yy:.1f}" r="2.5" fill="#3b528b"><title>week of '
                   f'{p.week_start:%Y-%m-%d}: {_pct(p.util_pct)}</title></circle>')
    out.append("</svg>")
    return "".join(out)


def _comparison_rows(c: Comparison, costs: CostModel) -> list[tuple[str, str, str, str, str]]:
    rows = []
    for a, b in c.rows:
        change = ("–" if a.util_pct is None or b.util_pct is None else f"{b.util_pct - a.util_pct:+.0f} pts")
        rows.append((_name(a.team), _pct(a.util_pct), _pct(b.util_pct), change,
                     f"{costs.format(a.held_idle_cost)} → {costs.format(b.held_idle_cost)}"))
    return rows


def render_html(q: QuarterReport, costs: CostModel, comparison: Comparison | None = None) -> str:
    weeks = len(q.weeks)
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>GPU utilization, {weeks} weeks</title>"
           f"<style>{_CSS} .grid{{display:flex;flex-wrap:wrap;gap:18px}} .miss{{color:#b3261e}}"
           f" .met{{color:#1b6e3a}}</style></head><body>",
           f"<h1>GPU utilization per team, {weeks} weeks</h1>",
           f"<div class='sub'>{q.since:%Y-%m-%d} – {q.until:%Y-%m-%d}; utilization while held "
           f"(free GPUs do not count against a team)</div>"]
    if q.simulated:
        out.append(f"<p class='waste'><b>{escape(SIMULATED)}</b></p>")
    if q.imported:
        out.append(f"<p class='sub'>{escape(IMPORTED)}</p>")
    out.append("<div class='grid'>")
    for s in q.lines():
        state = "" if s.on_target is None else (" <span class='met'>on target</span>" if s.on_target
                                                  else " <span class='miss'>below target</span>")
        out.append(f"<div><h2>{escape(_name(s.team))}</h2><div class='sub'>{escape(s.change_text())}{state}; "
                   f"held idle {costs.format(sum(p.held_idle_cost for p in s.points))}</div>{line_svg(s)}</div>")
    out.append("</div>")
    out.append("<h2>Week by week</h2><table><tr><th>team</th>"
               + "".join(f"<th>{w:%m-%d}</th>" for w in q.weeks) + "<th>target</th></tr>")
    for s in q.lines():
        out.append(f"<tr><td class='t'>{escape(_name(s.team))}</td>"
                   + "".join(f"<td>{_pct(p.util_pct)}</td>" for p in s.points)
                   + f"<td>{_pct(s.target_util_pct)}</td></tr>")
    out.append("</table>")
    if comparison is not None:
        out.append(f"<h2>Before and after</h2><div class='sub'>{comparison.before[0]:%Y-%m-%d} – "
                   f"{comparison.before[1]:%Y-%m-%d} against {comparison.after[0]:%Y-%m-%d} – "
                   f"{comparison.after[1]:%Y-%m-%d}</div><table><tr><th>team</th><th>before</th><th>after</th>"
                   f"<th>change</th><th>held idle cost</th></tr>")
        for row in _comparison_rows(comparison, costs):
            out.append("<tr>" + "".join(f"<td{' class=t' if i == 0 else ''}>{escape(v)}</td>"
                                        for i, v in enumerate(row)) + "</tr>")
        out.append("</table>")
    out.append("</body></html>\n")
    return "".join(out)


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
