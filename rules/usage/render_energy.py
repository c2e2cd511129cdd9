"""The weekly report's energy section (HTML and Markdown): what each team's GPUs drew and what it cost, and the
energy power caps saved (the draw before each cap less the draw under it, while capped)."""

from __future__ import annotations

from collections.abc import Callable

from rules.usage.html import render_template
from rules.usage.weekly import WeeklyReport, team_label


def energy_html(report: WeeklyReport, money: Callable[[float], str]) -> str:
    """The section as HTML (templates/energy.html.j2), or "" when there is nothing to show."""
    return render_template("energy.html.j2", report=report, money=money, team_label=team_label)


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
