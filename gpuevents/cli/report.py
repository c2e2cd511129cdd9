"""`gpuevents report --week`: the weekly usage report from the rollups store, as HTML, Markdown or JSON."""

from __future__ import annotations

import sys
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from gpuevents.clock import SystemClock
from gpuevents.config import Config, load_config
from gpuevents.costs import CostModel
from gpuevents.yamlpos import LocatedError
from rules.usage.render import render
from rules.usage.store import UsageStore
from rules.usage.summary import summary_text
from rules.usage.weekly import NO_TEAM_LABEL, WeeklyReport, build_report, week_before, week_ending


class ReportFormat(StrEnum):
    html = "html"
    md = "md"
    json = "json"


class NoUsageError(Exception):
    """There is no rollups store to report from."""


def make_report(config: Config, now: datetime, team: str | None = None) -> tuple[WeeklyReport, CostModel]:
    """The report for the seven days up to `now` (the current hour included), with the week before for week over
    week, from `engine.usage_db`."""
    path = config.engine.usage_db
    if not path.exists():
        raise NoUsageError(
            f"{path}: no usage recorded yet; the engine records it there (config engine.usage_db)"
        )
    costs = CostModel(config.costs)
    since, until = week_ending(now)
    before, _ = week_before(since)
    with UsageStore(path) as store:
        usage = store.usage(since.timestamp(), until.timestamp(), team)
        jobs = store.idle_jobs(since.timestamp(), until.timestamp(), team)
        previous = store.usage(before.timestamp(), since.timestamp(), team)
    report = build_report(
        usage, jobs, costs, since=since, until=until, generated_at=now,
        timezone=config.engine.timezone, team=team, previous=previous,
    )
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
    return summary_text(report, costs, top_jobs)


def report_command(
    week: Annotated[bool, typer.Option("--week", help="the seven days up to now (the default)")] = True,
    team: Annotated[str | None, typer.Option("--team", help=f"one team only; {NO_TEAM_LABEL!r} for none")] = None,
    fmt: Annotated[ReportFormat,
                   typer.Option("--format", help="html (one self-contained file), md or json")] = ReportFormat.html,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write here instead of stdout")] = None,
    config: Annotated[Path | None, typer.Option("-c", "--config", help="config YAML")] = None,
) -> None:
    """Weekly GPU usage: per team and owner, hours used and held idle, waste in money, week over week, the owners'
    leaderboard, top idle jobs, a heatmap."""
    try:
        cfg = load_config(config)
    except LocatedError as e:
        for p in e.problems:
            typer.echo(str(p), err=True)
        raise typer.Exit(1) from None
    wanted = "" if team == NO_TEAM_LABEL else team
    try:
        report, costs = make_report(cfg, SystemClock().now(), wanted)
    except NoUsageError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    text = render(report, costs, fmt.value)
    if output is None:
        sys.stdout.write(text)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {output} ({len(report.teams)} teams, {report.fleet.gpus} GPUs)", err=True)
