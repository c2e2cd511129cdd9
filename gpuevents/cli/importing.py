"""`gpuevents import`: the site's past into the usage store, from dcgm-exporter's series in Prometheus (or what
speaks its HTTP API) or from Slurm's accounting (DESIGN §6)."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from gpuevents.cli.common import ConfigOption, duration_option, load_config_or_exit, parse_day
from gpuevents.clock import SystemClock
from gpuevents.config import Config

if TYPE_CHECKING:
    from rules.history.promapi import PromClient
    from rules.history.promimport import PromImport


class Source(StrEnum):
    prometheus = "prometheus"
    slurm = "slurm"


def _window(since: str, until: str | None, now: datetime) -> tuple[datetime, datetime]:
    start = parse_day(since, "--since")
    end = now.replace(minute=0, second=0, microsecond=0)  # whole hours: the current one is the engine's
    if until:
        end = min(end, parse_day(until, "--until") + (timedelta(days=1) if len(until) <= 10 else timedelta(0)))
    if end <= start:
        raise typer.BadParameter("the window is empty: --since must come before --until (and before this hour)",
                                 param_hint="--since")
    return start, end


def import_command(
    source: Annotated[Source, typer.Option("--from", help="prometheus (dcgm-exporter's series) or slurm (sacct)")],
    since: Annotated[str, typer.Option("--since", help="start of the window (a date, or a time with its offset)")],
    until: Annotated[str | None, typer.Option(
        "--until", help="end of the window (a date names the whole day; default: the start of this hour)")] = None,
    url: Annotated[str | None, typer.Option(
        "--url", help="the Prometheus HTTP API (Thanos, Mimir, VictoriaMetrics too); auth from "
        "GPUEVENTS_PROMETHEUS_TOKEN, or GPUEVENTS_PROMETHEUS_USER and _PASSWORD")] = None,
    selector: Annotated[str, typer.Option(
        "--selector", help="PromQL label matchers for this cluster's series, e.g. 'cluster=\"a\"'")] = "",
    step: Annotated[str, typer.Option("--step", help="one reading per GPU this often (not under the scrape "
                                                     "interval)")] = "60s",
    chunk: Annotated[str, typer.Option("--chunk", help="read this much at a time (whole hours)")] = "6h",
    mem_floor: Annotated[float, typer.Option(
        "--idle-memory-mib", min=0, help="an idle GPU with more memory in use than this is held idle (a process "
        "keeps it), else unallocated")] = 256.0,
    again: Annotated[bool, typer.Option("--again", help="read the chunks imported before again")] = False,
    timeout: Annotated[str, typer.Option("--timeout", help="each request's timeout")] = "60s",
    pace: Annotated[str, typer.Option("--pace", help="at least this long between two requests")] = "200ms",
    retries: Annotated[int, typer.Option("--retries", min=0, help="tries again after an error or a timeout, "
                                         "waiting 1 s, 2 s, 4 s... in between")] = 5,
    sacct: Annotated[str, typer.Option("--sacct", help="the sacct to run (--from slurm)")] = "sacct",
    config: ConfigOption = None,
) -> None:
    """Bring the site's past into the usage store: dcgm-exporter's series from Prometheus, or jobs from Slurm's
    accounting; imported hours are marked imported, and hours the engine recorded live win."""
    cfg = load_config_or_exit(config)
    now = SystemClock().now()
    start, end = _window(since, until, now)
    err = Console(stderr=True)
    if source is Source.slurm:
        _slurm(cfg, sacct, start, end, err)
        return
    if not url:
        raise typer.BadParameter("--from prometheus needs --url, e.g. http://prometheus:9090", param_hint="--url")
    from rules.history.promapi import PromClient, PromError, auth_header
    from rules.history.promimport import PromImport

    step_s = duration_option(step, "--step")
    if step_s < 1:
        raise typer.BadParameter("at least 1s", param_hint="--step")
    plan = PromImport(url=url, since=start, until=end, step_s=step_s, chunk_s=duration_option(chunk, "--chunk"),
                      selector=selector, again=again, mem_floor_mib=mem_floor)
    try:
        client = PromClient(url, authorization=auth_header(os.environ),
                            timeout_s=duration_option(timeout, "--timeout"), pace_s=duration_option(pace, "--pace"),
                            retries=retries)
    except PromError as e:
        raise typer.BadParameter(str(e), param_hint="--url") from None
    _prometheus(cfg, plan, client, now, err)


def _prometheus(cfg: Config, plan: PromImport, client: PromClient, now: datetime, err: Console) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from rules.history.promapi import PromError
    from rules.history.promimport import import_prometheus

    bar = Progress(TextColumn("importing"), BarColumn(), MofNCompleteColumn(), TextColumn("chunks"),
                   TimeRemainingColumn(), console=err, transient=True)
    task = bar.add_task("import", total=None)
    try:
        with bar:
            outcome = import_prometheus(cfg, client, plan, now,
                                        progress=lambda done, total: bar.update(task, completed=done, total=total))
    except PromError as e:
        typer.echo(f"error: {e}", err=True)
        typer.echo("the chunks imported so far are stored; run the same command again to go on from there",
                   err=True)
        raise typer.Exit(1) from None
    for line in outcome.lines(plan):
        typer.echo(line)


def _slurm(cfg: Config, sacct: str, start: datetime, end: datetime, err: Console) -> None:
    from rules.history.sacct import SacctError
    from rules.history.slurmimport import SacctFailed, import_slurm, run_sacct

    try:
        with err.status("reading Slurm's accounting (sacct)"):
            output = run_sacct(sacct, start, end)
        outcome = import_slurm(cfg, output)
    except (SacctFailed, SacctError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    for line in outcome.lines(start, end):
        typer.echo(line)
