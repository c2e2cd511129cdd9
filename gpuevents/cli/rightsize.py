"""`gpuevents rightsize`: the smallest fit of each job or workload (a MIG slice, a smaller model, sharing) and what
it would save per week, biggest saving first, from the usage the engine recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuevents.cli.common import load_config_or_exit, usage_db
from gpuevents.clock import SystemClock
from gpuevents.config import Config
from gpuevents.costs import CostModel
from gpuevents.durations import parse_duration
from rules.usage.rightsize import (
    MIN_HOURS,
    Fit,
    OwnerFits,
    WorkloadUse,
    advise,
    observed_hours,
    per_owner,
    rank,
    uses_from_fits,
)
from rules.usage.schedules import Proposal, propose
from rules.usage.store import UsageStore

out = Console()


def rightsize(cfg: Config, since_s: float, team: str | None) -> tuple[list[tuple[Fit, WorkloadUse]], bool]:
    """Every workload's advice over the last `since_s` seconds, ranked; and whether simulated usage is included."""
    path = usage_db(cfg)
    now = SystemClock().now().timestamp()
    with UsageStore(path) as store:
        items = store.fits(now - since_s, now + 1)
        simulated = store.simulated(now - since_s, now + 1)
    uses = uses_from_fits(items, team)
    models = {(a.model, a.mem_total_mib) for _k, a in items if a.model and a.mem_total_mib}
    costs = CostModel(cfg.costs)
    window = observed_hours(items, since_s / 3600)
    fits = {u.key: (advise(u, models, costs, window_hours=window), u) for u in uses}
    ordered = rank(f for f, _u in fits.values())
    return [(f, fits[f.key][1]) for f in ordered], simulated


def too_little(unknown: int, total: int, since: str) -> str:
    """What a listing says of the workloads it could not advise on."""
    if unknown == total:
        return (f"Too little data to advise: each of the {total} workload(s) seen in the last {since} held its GPUs "
                f"under {MIN_HOURS:g} GPU-hour or had no memory or utilization reading. Let the engine record "
                "longer (or widen --since) and ask again.")
    return (f"{unknown} of {total} had too little data to advise (under {MIN_HOURS:g} GPU-hour observed, or no "
            "memory or utilization reading).")


def schedules(cfg: Config, since_s: float) -> tuple[list[Proposal], bool]:
    path = usage_db(cfg)
    now = SystemClock().now().timestamp()
    with UsageStore(path) as store:
        usage = store.usage(now - since_s, now + 1)
        fits = store.fits(now - since_s, now + 1)
        simulated = store.simulated(now - since_s, now + 1)
    return propose(usage, fits, CostModel(cfg.costs), cfg.engine.timezone), simulated


def _print_schedules(proposals: list[Proposal], simulated: bool, costs: CostModel, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"simulated": simulated, "proposals": [
            {"key": p.key, "cluster": p.cluster, "idle_window": p.window, "hours": p.idle.hours,
             "weekends": p.idle.weekends,
             "regularity": round(p.idle.regularity, 3), "days_observed": p.idle.days, "gpus": p.gpus,
             "saving_per_week": round(p.saving_per_week, 2),
             "rule": p.rule_yaml} for p in proposals]}, indent=2))
        return
    if not proposals:
        typer.echo("no node or Kubernetes service was idle in the same hours every day "
                   "(it takes 5 whole days of hourly usage; engine.usage_hourly_for keeps them)")
        return
    if simulated:
        out.print(Text("Includes simulated usage (gpuevents simulate --history).", style="bold red"))
    for p in proposals:
        out.print(Text(f"{p.key} (cluster {p.cluster}): idle {p.window} ({p.idle.regularity:.0%} of "
                       f"{p.idle.days} days), {p.gpus} GPU(s); "
                       f"scaling it down then saves about {costs.format(p.saving_per_week)} a week. Proposed rule "
                       "(check with `gpuevents rules check`, replay with `gpuevents rules backtest`):", style="bold"))
        typer.echo(p.rule_yaml)  # plain, so it can be copied into a rule file as it is


def _print_owners(owners: list[OwnerFits], simulated: bool, costs: CostModel, since: str, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"simulated": simulated, "currency": costs.currency, "owners": [
            {"owner": o.owner, "team": o.team, "workloads": o.workloads, "would_fit_smaller": o.advised,
             "too_little_data": o.too_little_data, "saving_per_week": round(o.saving_per_week, 2),
             "biggest": None if o.biggest is None else {"workload": o.biggest.key, "target": o.biggest.target,
                                                        "saving_per_week": round(o.biggest.saving_per_week, 2)}}
            for o in owners]}, indent=2))
        return
    if not owners:
        typer.echo(f"no job or workload held a GPU in the last {since}: nothing to advise")
        return
    if simulated:
        out.print(Text("Includes simulated usage (gpuevents simulate --history).", style="bold red"))
    table = Table(title=f"Right-sizing per user over the last {since}, biggest saving first")
    for col in ("owner", "team", "workloads", "would fit smaller", "too little data", "saves / week", "the most"):
        table.add_column(col, overflow="fold")
    for o in owners:
        most = "–" if o.biggest is None else f"{o.biggest.key} on {o.biggest.target}"
        table.add_row(Text(o.owner), Text(o.team or "–"), str(o.workloads), str(o.advised), str(o.too_little_data),
                      costs.format(o.saving_per_week), Text(most))
    out.print(table)


def rightsize_command(
    since: Annotated[str, typer.Option("--since", help="how far back to look, e.g. 7d")] = "7d",
    with_schedules: Annotated[bool, typer.Option(
        "--schedules", help="instead: nodes and services idle in the same hours each day, and a rule for it")] = False,
    team: Annotated[str | None, typer.Option("--team", help="one team only")] = None,
    by_owner: Annotated[bool, typer.Option("--by-owner", help="added up per user, biggest saving first")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    config: Annotated[Path | None, typer.Option("-c", "--config", help="config YAML")] = None,
) -> None:
    """Which jobs and workloads would run on a MIG slice, a smaller GPU or a shared GPU, and what that saves."""
    cfg = load_config_or_exit(config)
    try:
        window = parse_duration(since)
    except ValueError as e:
        typer.echo(f"--since: {e}", err=True)
        raise typer.Exit(2) from None
    costs = CostModel(cfg.costs)
    try:
        if with_schedules:
            proposals, simulated = schedules(cfg, window)
            _print_schedules(proposals, simulated, costs, as_json)
            return
        advice, simulated = rightsize(cfg, window, team)
    except LookupError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    if by_owner:
        _print_owners(per_owner(f for f, _u in advice), simulated, costs, since, as_json)
        return
    if as_json:
        typer.echo(json.dumps({"since_s": window, "simulated": simulated, "currency": costs.currency, "fits": [
            {"workload": f.key, "owner": f.owner, "team": f.team, "model": u.model, "gpus": u.gpus,
             "held_gpu_h": round(u.held_hours, 2), "peak_mem_mib": u.peak_mem_mib, "p95_util_pct": u.p95_util_pct,
             "p95_sm_active_pct": u.sm_active_pct, "fit": f.kind, "target": f.target or None,
             "share": round(f.share, 4), "saving_per_week": round(f.saving_per_week, 2), "reason": f.reason}
            for f, u in advice]}, indent=2))
        return
    if not advice:
        typer.echo(f"no job or workload held a GPU in the last {since}: nothing to advise")
        return
    if simulated:
        out.print(Text("Includes simulated usage (gpuevents simulate --history).", style="bold red"))
    table = Table(title=f"Right-sizing over the last {since}, biggest saving first")
    for col in ("workload", "owner", "model", "peak mem", "p95 util", "fits", "saves / week", "why"):
        table.add_column(col, overflow="fold")
    for f, u in advice:
        table.add_row(Text(f.key), Text(f.owner or "–"), Text(f"{u.gpus}× {u.model or '?'}"),
                      "–" if u.peak_mem_mib is None else f"{u.peak_mem_mib:,.0f} MiB",
                      "–" if u.p95_util_pct is None else f"{u.p95_util_pct:.0f} %",
                      Text(f.target or ("too little data" if f.kind == "unknown" else "its whole GPU")),
                      costs.format(f.saving_per_week) if f.advised else "–", Text(f.reason))
    out.print(table)
    total = sum(f.saving_per_week for f, _u in advice if f.advised)
    unknown = sum(1 for f, _u in advice if f.kind == "unknown")
    out.print(f"{sum(1 for f, _u in advice if f.advised)} of {len(advice)} would fit smaller: "
              f"{costs.format(total)} a week")
    if unknown:
        out.print(Text(too_little(unknown, len(advice), since), style="bold" if unknown == len(advice) else ""))
