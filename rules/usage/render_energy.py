"""The weekly report's energy section (HTML and Markdown): what each team's GPUs drew and what it cost, and the
energy power caps saved (the draw before each cap less the draw under it, while capped)."""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from rules.usage.weekly import WeeklyReport, team_label


def energy_html(report: WeeklyReport, money: Callable[[float], str]) -> str:
    fl = report.fleet
    if not report.teams and not fl.cap_saved_kwh:
        return ""
    e = escape
    parts = ["<h2>Energy</h2>"]
    if fl.cap_saved_kwh:
        parts.append(f'<p id="cap-saved">Saved by power caps: <b>{fl.cap_saved_kwh:,.1f} kWh</b> '
                     f"({e(money(fl.cap_saved_cost))})</p>")
    parts.append('<table id="energy"><tr><th>team</th><th>kWh</th><th>energy cost</th></tr>')
    parts += [f'<tr><td class="t">{e(team_label(t.team))}</td><td>{t.energy_kwh:,.1f}</td>'
              f"<td>{e(money(t.energy_cost))}</td></tr>" for t in sorted(report.teams, key=lambda t: -t.energy_kwh)]
    parts.append("</table>")
    return "".join(parts)


def energy_markdown(report: WeeklyReport, money: Callable[[float], str], cell: Callable[[str], str]) -> list[str]:
    fl = report.fleet
    if not report.teams and not fl.cap_saved_kwh:
        return []
    lines = ["", "## Energy", ""]
    if fl.cap_saved_kwh:
        lines += [f"Saved by power caps: {fl.cap_saved_kwh:,.1f} kWh ({money(fl.cap_saved_cost)})", ""]
    lines += ["| team | kWh | energy cost |", "| --- | ---: | ---: |"]
    lines += [f"| {cell(team_label(t.team))} | {t.energy_kwh:,.1f} | {money(t.energy_cost)} |"
              for t in sorted(report.teams, key=lambda t: -t.energy_kwh)]
    return lines
