"""`gpuevents job ID` and `gpuevents jobs`: job summaries (running or ended) from the usage store."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

import orjson
import typer

from gpuevents.cli.common import ClusterOption, NoUsageError, load_config_or_exit, usage_db
from gpuevents.clock import SystemClock
from gpuevents.config import Config
from gpuevents.costs import CostModel
from gpuevents.durations import format_duration, parse_duration
from rules.usage.jobstore import JobStore, JobSummary
from rules.usage.rightsize import HEADROOM, MIN_HOURS

ConfigOption = Annotated[Path | None, typer.Option("-c", "--config", help="config YAML")]
JsonOption = Annotated[bool, typer.Option("--json", help="JSON instead of text")]


def _store(cfg: Config) -> JobStore:
    try:
        return JobStore(usage_db(cfg, "job summaries"))
    except NoUsageError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} %"


def _gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:.1f} GiB"


def _no_fit(s: JobSummary) -> str:
    """Why a summary names no slice: too little seen, or none holds the job."""
    if s.gpu_hours < MIN_HOURS or s.peak_mem_mib is None or (s.p95_util_pct is None and s.peak_util_pct is None):
        return f"not assessed: too little data (under {MIN_HOURS:g} GPU-hour, or no memory or utilization reading)"
    return f"none: no MIG slice of its GPU holds its peak memory and p95 compute (plus {HEADROOM:.0%} headroom)"


def _when(d: datetime | None) -> str:
    return "-" if d is None else d.strftime("%Y-%m-%d %H:%M")


def describe(s: JobSummary, costs: CostModel) -> str:
    """The summary as a person reads it, a field a line (seff's shape)."""
    state = "running" if s.running else f"ended {_when(s.ended_at)}"
    where = ", ".join(s.nodes) or "-"
    lines = [
        f"Job {s.id} ({s.scheduler}{', ' + s.name if s.name else ''}): {state}"
        + ("  [SIMULATED: written by gpuevents simulate --history]" if s.simulated else "")
        + ("  [imported from the site's history: gpuevents import]" if s.imported else ""),
        f"  user       {s.user or '-'}   account {s.account or '-'}   partition {s.partition or '-'}   "
        f"qos {s.qos or '-'}",
        f"  GPUs       {s.gpu_count} x {s.model or 'unknown model'} on {where}",
        f"  started    {_when(s.started_at)}   for {format_duration(s.hours * 3600)}",
        f"  GPU-hours  {s.gpu_hours:.2f}   cost {costs.format(s.cost)}",
        f"  util       mean {_pct(s.mean_util_pct)}   p95 {_pct(s.p95_util_pct)}   peak {_pct(s.peak_util_pct)}",
        "  SM active  " + (f"mean {_pct(s.mean_sm_active_pct)}   p95 {_pct(s.p95_sm_active_pct)}"
                            if s.mean_sm_active_pct is not None else "not measured"),
        f"  memory     p95 {_gib(s.p95_mem_mib)}   peak {_gib(s.peak_mem_mib)}",
        f"  idle       {_pct(s.idle_share_pct)} of its GPU time",
        f"  smaller fit {s.smaller_fit or _no_fit(s)}",
        f"  {s.line(costs)}",
    ]
    return "\n".join(lines)


def job_command(
    job_id: Annotated[str, typer.Argument(help="the job id (Slurm's, or a Kubernetes job's namespace/Kind/name)")],
    json: JsonOption = False,
    cluster: ClusterOption = None,
    config: ConfigOption = None,
) -> None:
    """A job's summary: GPU-hours, mean, p95 and peak utilisation and SM activity, p95 and peak memory, idle share,
    cost, the MIG slice it would have fitted.

    Job ids are a site's own: `--cluster` names the site (default: the config's `cluster`)."""
    cfg = load_config_or_exit(config)
    site = cluster or cfg.cluster
    with _store(cfg) as store:
        found = store.find(job_id, site)
        elsewhere = sorted({s.cluster for s in store.find(job_id)}) if not found else []
    if not found:
        hint = f"; seen in {', '.join(elsewhere)}: add --cluster" if elsewhere else ""
        typer.echo(f"job {job_id}: no summary in cluster {site} (not seen by the engine, or older than "
                   f"engine.usage_retention){hint}", err=True)
        raise typer.Exit(1)
    if json:
        typer.echo(orjson.dumps([s.model_dump(mode="json") for s in found], option=orjson.OPT_INDENT_2).decode())
        return
    costs = CostModel(cfg.costs)
    typer.echo("\n\n".join(describe(s, costs) for s in found))


def jobs_command(
    user: Annotated[str | None, typer.Option("--user", help="one user's jobs")] = None,
    since: Annotated[str, typer.Option("--since", help="jobs seen in this window, e.g. 7d, 12h")] = "7d",
    json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """The jobs of a window, most recent first, one a line."""
    try:
        window = parse_duration(since)
    except ValueError as e:
        typer.echo(f"--since: {e}", err=True)
        raise typer.Exit(2) from None
    cfg = load_config_or_exit(config)
    with _store(cfg) as store:
        found = store.window(SystemClock().now().timestamp() - window, user)
    if json:
        typer.echo(orjson.dumps([s.model_dump(mode="json") for s in found], option=orjson.OPT_INDENT_2).decode())
        return
    costs = CostModel(cfg.costs)
    if not found:
        typer.echo(f"no jobs seen in the last {since}{' for ' + user if user else ''}")
        return
    if any(s.simulated for s in found):
        typer.echo("Includes simulated jobs (gpuevents simulate --history): marked *.")
    if any(s.imported for s in found):
        typer.echo("Includes jobs imported from the site's history (gpuevents import): marked +.")
    typer.echo(f"{'JOB':<14} {'USER':<10} {'PARTITION':<10} {'GPUS':>4} {'HOURS':>6} {'GPU-H':>7} {'UTIL':>5} "
               f"{'IDLE':>5} {'COST':>9}  STATE")
    for s in found:
        typer.echo(f"{s.id[:14]:<14} {(s.user or '-')[:10]:<10} {(s.partition or s.namespace or '-')[:10]:<10} "
                   f"{s.gpu_count:>4} {s.hours:>6.1f} {s.gpu_hours:>7.2f} {_pct(s.mean_util_pct):>5} "
                   f"{_pct(s.idle_share_pct):>5} {costs.format(s.cost):>9}  "
                   f"{'running' if s.running else 'ended'}{' *' if s.simulated else ''}{' +' if s.imported else ''}")
