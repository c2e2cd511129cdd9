"""The weekly report's keeps section (HTML and Markdown): per team, how many keeps, the GPU-hours kept, the share
of the kept time that stayed idle, and the reasons given."""

from __future__ import annotations

from collections.abc import Callable

from rules.usage.html import render_template
from rules.usage.keeps import TeamKeeps
from rules.usage.weekly import team_label


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}%"


def keep_count(t: TeamKeeps) -> str:
    """"4", or "4 of 5" against the team's budget, with the owners who used all of theirs."""
    text = f"{t.count} of {t.budget}" if t.budget is not None else str(t.count)
    return text + (f" (budget used: {', '.join(t.at_budget)})" if t.at_budget else "")


def keeps_html(keeps: list[TeamKeeps]) -> str:
    """The section as HTML (templates/keeps.html.j2), or "" when nobody kept a GPU."""
    return render_template("keeps.html.j2", keeps=keeps, pct=_pct, count=keep_count, team_label=team_label)


def keeps_markdown(keeps: list[TeamKeeps], cell: Callable[[str], str]) -> list[str]:
    if not keeps:
        return []
    lines = ["", "## Keeps", "", "| team | keeps | kept GPU-h | idle while kept | why |",
             "| --- | ---: | ---: | ---: | --- |"]
    for t in keeps:
        why = "; ".join(f"{r.entity_id} ({r.by}): {r.reason}" for r in t.reasons)
        lines.append(f"| {cell(team_label(t.team))} | {cell(keep_count(t))} | {t.kept_gpu_hours:,.1f} | "
                     f"{_pct(t.idle_share_pct)} | {cell(why)} |")
    return lines


def keeps_summary(keeps: list[TeamKeeps], e: Callable[[str], str]) -> list[str]:
    """Slack lines: one per team, most kept GPU-hours first."""
    return [f"Keeps, {e(team_label(t.team))}: {t.count} ({t.kept_gpu_hours:,.1f} GPU-h kept, "
            f"{_pct(t.idle_share_pct)} of it idle); why: " + "; ".join(e(r.reason) for r in t.reasons[:3])
            for t in keeps[:4]]
