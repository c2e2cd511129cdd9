"""The weekly report's keeps section (HTML and Markdown): per team, how many keeps, the GPU-hours kept, the share
of the kept time that stayed idle, and the reasons given."""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from rules.usage.keeps import TeamKeeps
from rules.usage.weekly import team_label


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}%"


def _count(t: TeamKeeps) -> str:
    """"4", or "4 of 5" against the team's budget, with the owners who used all of theirs."""
    text = f"{t.count} of {t.budget}" if t.budget is not None else str(t.count)
    return text + (f" (budget used: {', '.join(t.at_budget)})" if t.at_budget else "")


def keeps_html(keeps: list[TeamKeeps]) -> str:
    if not keeps:
        return ""
    e = escape
    parts = ['<h2>Keeps</h2><table id="keeps"><tr><th>team</th><th>keeps</th><th>kept GPU-h</th>'
             "<th>idle while kept</th><th>why (most GPU-hours first)</th></tr>"]
    for t in keeps:
        reasons = "<br>".join(
            f"{e(r.entity_id)} ({e(r.by)}, {r.gpu_hours:,.1f} GPU-h, idle {_pct(r.idle_share_pct)}"
            + (f", approved by {e(r.approved_by)}" if r.approved_by else "") + f"): {e(r.reason)}"
            for r in t.reasons)
        parts.append(f'<tr><td class="t">{e(team_label(t.team))}</td><td>{e(_count(t))}</td>'
                     f"<td>{t.kept_gpu_hours:,.1f}</td><td>{_pct(t.idle_share_pct)}</td>"
                     f'<td class="t">{reasons}</td></tr>')
    parts.append("</table>")
    return "".join(parts)


def keeps_markdown(keeps: list[TeamKeeps], cell: Callable[[str], str]) -> list[str]:
    if not keeps:
        return []
    lines = ["", "## Keeps", "", "| team | keeps | kept GPU-h | idle while kept | why |",
             "| --- | ---: | ---: | ---: | --- |"]
    for t in keeps:
        why = "; ".join(f"{r.entity_id} ({r.by}): {r.reason}" for r in t.reasons)
        lines.append(f"| {cell(team_label(t.team))} | {cell(_count(t))} | {t.kept_gpu_hours:,.1f} | "
                     f"{_pct(t.idle_share_pct)} | {cell(why)} |")
    return lines


def keeps_summary(keeps: list[TeamKeeps], e: Callable[[str], str]) -> list[str]:
    """Slack lines: one per team, most kept GPU-hours first."""
    return [f"Keeps, {e(team_label(t.team))}: {t.count} ({t.kept_gpu_hours:,.1f} GPU-h kept, "
            f"{_pct(t.idle_share_pct)} of it idle); why: " + "; ".join(e(r.reason) for r in t.reasons[:3])
            for t in keeps[:4]]
