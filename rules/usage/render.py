"""The weekly report written out: one self-contained HTML file (inline SVG heatmap), Markdown, JSON."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from zoneinfo import ZoneInfo

from markupsafe import Markup

from gpuevents.costs import CostModel
from rules.usage.colours import legend_svg, util_colour
from rules.usage.html import render_template
from rules.usage.render_energy import energy_markdown
from rules.usage.render_keeps import keep_count, keeps_markdown
from rules.usage.trends import Trend
from rules.usage.weekly import Heatmap, HeatmapRow, WeeklyReport, team_label

CELL_W = 5
CELL_H = 12
LABEL_W = 150
MAX_TITLED_ROWS = 64  # per-cell tooltips beyond this would make the file heavy

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d232a;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px}
.sub{color:#5b6570;margin-bottom:16px}
.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{border:1px solid #dde2e7;border-radius:8px;padding:10px 14px;min-width:150px}
.card b{display:block;font-size:20px} .card.waste b{color:#b3261e}
table{border-collapse:collapse;margin:4px 0 12px}
th,td{padding:4px 10px;border-bottom:1px solid #e6e9ed;text-align:right}
th:first-child,td:first-child,td.t{text-align:left} th{background:#f5f7f9;font-weight:600}
tr.team td{font-weight:600;background:#fafbfc} .waste{color:#b3261e}
.legend{color:#5b6570;font-size:12px} .up{color:#1b6e3a} .down{color:#b3261e}
"""


def _h(hours: float) -> str:
    return f"{hours:,.1f}"


def _pct(util: float | None) -> str:
    return "–" if util is None else f"{util:.0f}%"


def _period(report: WeeklyReport) -> str:
    tz = ZoneInfo(report.timezone)
    a, b = report.since.astimezone(tz), report.until.astimezone(tz)
    return f"{a:%a %Y-%m-%d %H:%M} – {b:%a %Y-%m-%d %H:%M} ({report.timezone})"


def heatmap_svg(heatmap: Heatmap) -> str:
    """GPU (or node) × hour; fill = utilization (viridis); a white dot ringed in black marks an hour held idle."""
    titled = len(heatmap.rows) <= MAX_TITLED_ROWS

    def cells(row: HeatmapRow) -> Iterator[tuple[int, str, str | None, bool]]:
        """Per hour: the cell's x, its fill, its tooltip (None: none) and whether it was held idle."""
        for i, (util, held) in enumerate(zip(row.cells, row.held, strict=True)):
            tip = (f"{row.label} {heatmap.hours[i]:%a %H:%M} {util:.0f}%{' held idle' if held else ''}"
                   if titled and util is not None else None)
            yield LABEL_W + i * CELL_W, util_colour(util), tip, held

    return render_template(
        "heatmap.svg.j2", hm=heatmap, cell_w=CELL_W, cell_h=CELL_H, label_w=LABEL_W, cells=cells,
        width=LABEL_W + len(heatmap.hours) * CELL_W + 10, height=24 + len(heatmap.rows) * CELL_H + 8,
        dot_dx=CELL_W / 2 - 0.25, dot_dy=CELL_H / 2 - 0.5)


def render_html(report: WeeklyReport, costs: CostModel) -> str:
    """One HTML file with everything inline (templates/weekly.html.j2); every name from a machine is escaped."""
    title = "GPU usage report" + (f" — team {team_label(report.team)}" if report.team is not None else "")
    page = render_template(
        "weekly.html.j2", report=report, css=Markup(_CSS), title=title, period=_period(report),
        generated=f"{report.generated_at:%Y-%m-%d %H:%M %Z}", money=costs.format, h=_h, pct=_pct,
        signed_text=_md_signed, team_label=team_label, keeps=report.keeps, count=keep_count,
        heatmap=Markup(heatmap_svg(report.heatmap)), legend=Markup(legend_svg()))
    return page + "\n"


# Every character with a meaning inside a GFM table cell (inline Markdown, raw HTML, entities, the
# cell separator, GitHub's $math$) is escaped; line breaks and other control characters become
# spaces, so the row stays one line. `:` and the dot of `www.` are escaped because GFM's autolink
# extension links `http://…` and `www.…` only where it reads them unescaped; e-mail addresses
# still become links, to the address they show.
_MD_ESCAPES = {ord(c): "\\" + c for c in "\\`*_~[]!|$:"} | {ord("&"): "&amp;", ord("<"): "&lt;", ord(">"): "&gt;"}
_MD_WWW = re.compile(r"(www)\.", re.IGNORECASE)


def markdown_cell(text: str) -> str:
    """Any string as one inert Markdown table cell: shown as written, never a link, image or markup."""
    one_line = "".join(" " if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c for c in text)
    return _MD_WWW.sub(r"\1\\.", one_line.translate(_MD_ESCAPES))


def render_markdown(report: WeeklyReport, costs: CostModel) -> str:
    f = costs.format
    fl = report.fleet
    lines = [
        "# GPU usage report" + (f" — team {markdown_cell(team_label(report.team))}" if report.team is not None else ""),
        "",
        _period(report),
        "",
        *(["**Includes simulated usage (gpuevents simulate --history): not a real fleet's figures.**", ""]
          if report.simulated else []),
        *(["Includes hours imported from the site's history (gpuevents import), not recorded live.", ""]
          if report.imported else []),
        f"- GPUs: {fl.gpus}; GPU-hours busy {_h(fl.busy_h)}, held idle {_h(fl.held_idle_h)}, "
        f"unallocated {_h(fl.unallocated_h)}"
        + (f", held with activity unknown {_h(fl.unknown_h)}" if fl.unknown_h else "")
        + f"; utilization {_pct(fl.util_pct)}",
        f"- Waste: held idle {f(fl.held_idle_cost)}, unallocated {f(fl.unallocated_cost)}; "
        f"total cost {f(fl.cost)}, energy {fl.energy_kwh:,.0f} kWh",
        "",
        "## Teams and owners",
        "",
        "| team / owner | busy GPU-h | held idle GPU-h | utilization | held idle cost | unallocated GPU-h "
        "| unallocated cost |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for t in report.teams:
        lines.append(f"| **{markdown_cell(team_label(t.team))}** | {_h(t.busy_h)} | {_h(t.held_idle_h)} | "
                     f"{_pct(t.util_pct)} | {f(t.held_idle_cost)} | {_h(t.unallocated_h)} | {f(t.unallocated_cost)} |")
        for o in t.owners:
            lines.append(f"| {markdown_cell(o.owner)} | {_h(o.busy_h)} | {_h(o.held_idle_h)} | {_pct(o.util_pct)} | "
                         f"{f(o.held_idle_cost)} | | |")
    if report.week_over_week is not None:
        lines += ["", "## Week over week", "", "The week before → this week.", "",
                  "| team | utilization | change | used share | held idle GPU-h | change | waste | change |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        wow = report.week_over_week
        for trend in [wow.fleet, *wow.teams]:
            name = "**fleet**" if trend.team is None else markdown_cell(team_label(trend.team))
            lines.append(f"| {name} | {_md_trend(trend, costs)} |")
    if report.kpi:
        lines += ["", "## Utilization over 13 weeks", ""]
        lines += [f"- {markdown_cell('fleet' if k.team is None else team_label(k.team))}: {markdown_cell(k.text)}"
                  for k in report.kpi]
    if report.rightsize:
        lines += ["", "## Would fit smaller", "", "| workload | owner | GPUs | fits | saves / week |",
                  "| --- | --- | --- | --- | ---: |"]
        lines += [f"| {markdown_cell(r.workload)} | {markdown_cell(r.owner or '–')} | {r.gpus}× "
                  f"{markdown_cell(r.model or '?')} | {markdown_cell(r.fits)} | {f(r.saving_per_week)} |"
                  for r in report.rightsize]
    if report.exemptions:
        lines += ["", "## Exempt by annotation", "", "| job | user | exemption | until | GPU-h | idle |",
                  "| --- | --- | --- | --- | ---: | ---: |"]
        lines += [f"| {markdown_cell(x.job)} | {markdown_cell(x.user or '–')} | {markdown_cell(x.exemption)} | "
                  f"{f'{x.until:%Y-%m-%d %H:%M %Z}' if x.until else '–'} | {_h(x.gpu_hours)} | "
                  f"{_pct(x.idle_share_pct)} |" for x in report.exemptions]
    lines += keeps_markdown(report.keeps, markdown_cell)
    lines += energy_markdown(report, costs.format, markdown_cell)
    lines += ["", "## Held-idle leaderboard", ""]
    if report.leaderboard:
        lines += ["| # | owner | teams | held idle GPU-h | held idle cost | busy GPU-h | utilization | used share |",
                  "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for leader in report.leaderboard:
            teams = markdown_cell(", ".join(team_label(t) for t in leader.teams))
            lines.append(f"| {leader.rank} | {markdown_cell(leader.owner)} | {teams} | {_h(leader.held_idle_h)} | "
                         f"{f(leader.held_idle_cost)} | {_h(leader.busy_h)} | {_pct(leader.util_pct)} | "
                         f"{_pct(leader.busy_share_pct)} |")
    else:
        lines.append("Nobody held an idle GPU this week.")
    lines += ["", "## Top idle jobs", ""]
    if report.top_idle_jobs:
        lines += ["| job | job id | node | GPUs | owner | team | held idle GPU-h | cost |",
                  "| --- | --- | --- | --- | --- | --- | ---: | ---: |"]
        for j in report.top_idle_jobs:
            lines.append(f"| {markdown_cell(j.name)} | {markdown_cell(j.job_id or '')} | {markdown_cell(j.node)} | "
                         f"{','.join(map(str, j.gpus))} | {markdown_cell(j.owner)} | "
                         f"{markdown_cell(team_label(j.team))} | {_h(j.held_idle_h)} | {f(j.cost)} |")
    else:
        lines.append("No job held an idle GPU this week.")
    return "\n".join(lines) + "\n"


def _md_signed(value: float | None, unit: str, good_when_up: bool) -> str:
    if value is None:
        return "–"
    if abs(value) < 0.05:
        return f"±0{unit}"
    return f"{value:+.1f}{unit} ({'better' if (value > 0) == good_when_up else 'worse'})"


def _md_trend(t: Trend, costs: CostModel) -> str:
    f = costs.format
    prev_waste = "–" if t.prev_waste_cost is None else f(t.prev_waste_cost)
    prev_held = "–" if t.prev_held_idle_h is None else _h(t.prev_held_idle_h)
    return " | ".join([
        f"{_pct(t.prev_util_pct)} → {_pct(t.util_pct)}", _md_signed(t.util_change_pts, " pts", True),
        f"{_pct(t.prev_busy_share_pct)} → {_pct(t.busy_share_pct)}",
        f"{prev_held} → {_h(t.held_idle_h)}", _md_signed(t.held_idle_change_pct, " %", False),
        f"{prev_waste} → {f(t.waste_cost)}", _md_signed(t.waste_change_pct, " %", False),
    ])


def render_json(report: WeeklyReport) -> str:
    return report.model_dump_json(indent=2) + "\n"


def render(report: WeeklyReport, costs: CostModel, fmt: str) -> str:
    if fmt == "html":
        return render_html(report, costs)
    if fmt in ("md", "markdown"):
        return render_markdown(report, costs)
    if fmt == "json":
        return render_json(report)
    raise ValueError(f"unknown report format {fmt!r}; use html, md or json")
