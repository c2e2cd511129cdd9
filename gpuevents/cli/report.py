"""`gpuevents report --week`: the weekly usage report from the rollups store, as HTML, Markdown or JSON."""

from __future__ import annotations

import sys
from collections import Counter
from datetime import datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from gpuevents.cli.common import NoUsageError, load_config_or_exit, parse_day, usage_db
from gpuevents.clock import SystemClock
from gpuevents.config import Config
from gpuevents.costs import CostModel
from rules.usage.jobstore import JobStore
from rules.usage.keeps import KeepStore, team_keeps
from rules.usage.quarter import build_quarter, compare
from rules.usage.render import render
from rules.usage.render_quarter import render_quarter
from rules.usage.rightsize import rightsize_lines
from rules.usage.store import UsageStore
from rules.usage.weekly import (
    NO_TEAM_LABEL,
    ExemptionLine,
    KpiLine,
    WeeklyReport,
    build_report,
    week_before,
    week_ending,
)


class ReportFormat(StrEnum):
    html = "html"
    md = "md"
    markdown = "markdown"  # the same as md: the README calls it Markdown
    json = "json"


def make_report(config: Config, now: datetime, team: str | None = None) -> tuple[WeeklyReport, CostModel]:
    """The report for the seven days up to `now` (the current hour included), with the week before for week over
    week, from `engine.usage_db`."""
    path = usage_db(config)
    costs = CostModel(config.costs)
    since, until = week_ending(now)
    before, _ = week_before(since)
    quarter_since = until - timedelta(weeks=13)
    with UsageStore(path) as store:
        usage = store.usage(since.timestamp(), until.timestamp(), team)
        jobs = store.idle_jobs(since.timestamp(), until.timestamp(), team)
        previous = store.usage(before.timestamp(), since.timestamp(), team)
        quarter_rows = store.week_sums(quarter_since.timestamp(), until.timestamp(), team)
        fit_rows = store.fits(since.timestamp(), until.timestamp())
        simulated = store.simulated(since.timestamp(), until.timestamp())
        imported = store.imported(since.timestamp(), until.timestamp())
    report = build_report(
        usage, jobs, costs, since=since, until=until, generated_at=now,
        timezone=config.engine.timezone, team=team, previous=previous,
    )
    targets = {name: t.target_util_pct for name, t in config.teams.items()}
    q = build_quarter(quarter_rows, costs, quarter_since, until, targets if team is None else
                      {team: targets.get(team)}, team=team)
    shown = q.lines()  # a team's report reads the team's rows only: no "fleet" line that is the team again
    report.kpi = [KpiLine(team=s.team, text=s.change_text(), on_target=s.on_target) for s in shown if s.known]
    report.rightsize = rightsize_lines(fit_rows, costs, (until - since).total_seconds() / 3600, team)
    report.simulated = simulated
    report.imported = imported
    with JobStore(path) as jobs_store:
        exempt = [j for j in jobs_store.window(since.timestamp()) if j.exemption
                  and (team is None or j.namespace == team)]  # a team's report: its namespace's
    report.exemptions = [
        ExemptionLine(job=f"job/{j.scheduler}/{j.id}", user=j.user, namespace=j.namespace, exemption=j.exemption or "",
                      until=j.exempt_until, gpu_hours=j.gpu_hours, idle_share_pct=j.idle_share_pct)
        for j in sorted(exempt, key=lambda j: -(j.gpu_hours * (j.idle_share_pct or 0)))][:20]
    with KeepStore(path) as keeps:
        kept = keeps.window(since.timestamp(), until.timestamp())
    report.keeps = team_keeps(kept, usage, since.timestamp(), until.timestamp(), team)
    taken = Counter(k.by for k in kept if k.start >= since.timestamp() and not k.approved_by)
    for t in report.keeps:  # keep budgets (gpuevents/config/keep.py): the team's, and its owners who used theirs
        t.budget = config.teams[t.team].keeps_per_week if t.team in config.teams else None
        t.at_budget = sorted(f"{by} {n} of {b}" for by in {r.by for r in t.reasons} if by in taken
                             for n, b in [(taken[by], config.keep_budget.owner_budget(by))]
                             if b is not None and n >= b)
    return report, costs


def weekly_summary(config: Config, now: datetime, team: str | None, top_jobs: int) -> str | None:
    """The `report` action's message for `team` (None: the fleet), handed to actions as `Services.report`:
    None when that team recorded nothing this week; LookupError when there is no rollups store."""
    try:
        report, costs = make_report(config, now, team)
    except NoUsageError as e:
        raise LookupError(str(e)) from None
    if team is not None and not report.teams:
        return None
    from actions import slack_format
    from rules.usage.summary import summary_text

    return summary_text(report, costs, top_jobs, escape=slack_format.escape, cut=slack_format.truncate)


def _day(text: str, flag: str) -> datetime:
    return parse_day(text, flag)


def _period(text: str) -> tuple[datetime, datetime]:
    start, sep, end = text.partition("..")
    if not sep:
        raise typer.BadParameter(f"{text!r}: write a period as START..END, e.g. 2026-09-01..2026-09-30",
                                 param_hint="--compare")
    a, b = _day(start, "--compare"), _day(end, "--compare")
    if len(end) <= 10:
        b += timedelta(days=1)  # a date names the whole day
    if b <= a:
        raise typer.BadParameter(f"{text!r}: the period ends before it starts", param_hint="--compare")
    return a, b


def quarter_text(cfg: Config, now: datetime, weeks: int | None, since: str | None, until: str | None,
                 compare_with: str | None, team: str | None, fmt: str) -> tuple[str, int]:
    """The KPI report over many weeks (and a comparison): its text and how many teams it shows."""
    path = usage_db(cfg)
    costs = CostModel(cfg.costs)
    end = now
    if until:
        end = _day(until, "--until") + (timedelta(days=1) if len(until) <= 10 else timedelta(0))  # a date: its end
    start = _day(since, "--since") if since else end - timedelta(weeks=weeks or 13)
    if end <= start:
        raise typer.BadParameter("--until must come after --since", param_hint="--until")
    targets = {name: t.target_util_pct for name, t in cfg.teams.items()}
    with UsageStore(path) as store:
        rows = store.week_sums(start.timestamp(), end.timestamp(), team)  # per week, summed in SQLite
        simulated = store.simulated(start.timestamp(), end.timestamp())
        imported = store.imported(start.timestamp(), end.timestamp())
        before_rows = None
        if compare_with:
            a, b = _period(compare_with)
            before_rows = store.week_sums(a.timestamp(), b.timestamp(), team, step=(b - a).total_seconds())
    if team is not None:
        targets = {team: targets.get(team)}
    q = build_quarter(rows, costs, start, end, targets, simulated=simulated, team=team)
    q.imported = imported
    comparison = compare(before_rows, rows, costs, _period(compare_with), (start, end), team) \
        if compare_with and before_rows is not None else None
    return render_quarter(q, costs, fmt, comparison), len(q.teams)


def report_command(
    week: Annotated[bool, typer.Option("--week", help="the seven days up to now (the default)")] = True,
    weeks: Annotated[int | None, typer.Option("--weeks", min=1, max=106,
                                              help="utilization per team, week by week, against its target")] = None,
    since: Annotated[str | None, typer.Option("--since", help="start of the weeks shown (a date)")] = None,
    until: Annotated[str | None, typer.Option("--until", help="end of the weeks shown (a date; default now)")] = None,
    compare_with: Annotated[str | None, typer.Option(
        "--compare", help="a period to compare with, START..END (e.g. 2026-09-01..2026-09-30)")] = None,
    team: Annotated[str | None, typer.Option("--team", help=f"one team only; {NO_TEAM_LABEL!r} for none")] = None,
    fmt: Annotated[ReportFormat,
                   typer.Option("--format", help="html (one self-contained file), md (or markdown) or json"),
                   ] = ReportFormat.html,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write here instead of stdout")] = None,
    config: Annotated[Path | None, typer.Option("-c", "--config", help="config YAML")] = None,
) -> None:
    """Weekly GPU usage: per team and owner, hours used and held idle, waste in money, week over week, the owners'
    leaderboard, top idle jobs, a heatmap."""
    cfg = load_config_or_exit(config)
    wanted = "" if team == NO_TEAM_LABEL else team
    fmt_name = "md" if fmt is ReportFormat.markdown else fmt.value  # markdown is md's long name
    if weeks is not None or since is not None or until is not None or compare_with is not None:
        try:
            text, n = quarter_text(cfg, SystemClock().now(), weeks, since, until, compare_with, wanted, fmt_name)
        except NoUsageError as e:
            typer.echo(str(e), err=True)
            raise typer.Exit(1) from None
        _write(text, output, f"{n} teams")
        return
    try:
        report, costs = make_report(cfg, SystemClock().now(), wanted)
    except NoUsageError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    text = render(report, costs, fmt_name)
    _write(text, output, f"{len(report.teams)} teams, {report.fleet.gpus} GPUs")


def _write(text: str, output: Path | None, what: str) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {output} ({what})", err=True)
