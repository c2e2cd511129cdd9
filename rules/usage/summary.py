"""The weekly report as a short Slack summary: what the `report` action posts to each team's channel. Slack's
own escaping and length limit are handed in (actions/slack_format.py, by the composition root): visibility
code does not import actions."""

from __future__ import annotations

from collections.abc import Callable

from gpuevents.costs import CostModel
from rules.usage.render_keeps import keeps_summary
from rules.usage.trends import Trend
from rules.usage.weekly import WeeklyReport, team_label


def _trend(report: WeeklyReport) -> Trend | None:
    """The report's own line of week over week: the fleet's, or its team's."""
    wow = report.week_over_week
    if wow is None:
        return None
    if report.team is None:
        return wow.fleet
    return next((t for t in wow.teams if t.team == report.team), None)


def summary_text(report: WeeklyReport, costs: CostModel, top_jobs: int, *, escape: Callable[[str], str],
                 cut: Callable[[str], str]) -> str:
    """The weekly summary as Slack mrkdwn: names from machines passed through `escape`, the whole through `cut`
    (Slack's limit on a section's text)."""
    e = escape
    f = costs.format
    fl = report.fleet
    who = "the fleet" if report.team is None else f"team *{e(team_label(report.team))}*"
    util = "–" if fl.util_pct is None else f"{fl.util_pct:.0f}%"
    lines = [
        f"*Weekly GPU usage for {who}* ({report.since:%b %d} – {report.until:%b %d})",
        f"{fl.busy_h:,.1f} GPU-hours busy · utilization {util} · total cost {f(fl.cost)}",
        f":warning: Held idle: {fl.held_idle_h:,.1f} GPU-hours = *{f(fl.held_idle_cost)}* · "
        f"unallocated: {fl.unallocated_h:,.1f} GPU-hours = {f(fl.unallocated_cost)}",
    ]
    owners = sorted((o for t in report.teams for o in t.owners if o.held_idle_h > 0),
                    key=lambda o: -o.held_idle_cost)[:5]
    if owners:
        lines.append("Held idle by: " + ", ".join(
            f"{e(o.owner)} {o.held_idle_h:,.1f} h ({f(o.held_idle_cost)})" for o in owners))
    trend = _trend(report)
    if trend is not None and trend.prev_util_pct is not None and trend.util_pct is not None:
        held = "" if trend.held_idle_change_pct is None else f", held idle {trend.held_idle_change_pct:+.0f}%"
        lines.append(f"Against last week: utilization {trend.prev_util_pct:.0f}% → {trend.util_pct:.0f}% "
                     f"({trend.util_change_pts or 0:+.1f} pts){held}")
    for k in report.kpi[:4]:
        name = "the fleet" if k.team is None else e(team_label(k.team))
        lines.append(f"Utilization over 13 weeks, {name}: {e(k.text)}")
    if report.rightsize:
        total = sum(r.saving_per_week for r in report.rightsize)
        best = report.rightsize[0]
        lines.append(f"{len(report.rightsize)} workloads would fit smaller, saving {f(total)} a week; the most: "
                     f"{e(best.workload)} ({e(best.owner or 'unknown')}) on {e(best.fits)}")
    if report.exemptions:
        idle = [x for x in report.exemptions if (x.idle_share_pct or 0) >= 50]
        lines.append(f"{len(report.exemptions)} job(s) exempt by annotation this week, {len(idle)} of them idle "
                     "half their time or more: " + ", ".join(e(x.job) for x in report.exemptions[:3]))
    lines += keeps_summary(report.keeps, e)
    if report.simulated:
        lines.append("_Includes simulated usage (gpuevents simulate --history)._")
    for j in report.top_idle_jobs[:top_jobs]:
        job = f" (job {e(j.job_id)})" if j.job_id and j.job_id not in j.name else ""
        lines.append(f"• {e(j.name)}{job} on {e(j.node)} GPU {','.join(map(str, j.gpus))} ({e(j.owner)}): "
                     f"{j.held_idle_h:,.1f} h idle, {f(j.cost)}")
    return cut("\n".join(lines))
