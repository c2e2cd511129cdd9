"""`gpuevents rules check`, `rules test` and `rules backtest`: validate, unit-test and replay rule files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

from gpuevents.cli.common import (
    ConfigOption,
    cells,
    client_config,
    duration_option,
    load_config_or_exit,
    run_async,
)
from gpuevents.yamlpos import LocatedError
from rules.intake.check import check_paths
from rules.offline.ruletests import run_test_file

if TYPE_CHECKING:
    from gpuevents.config import Config
    from rules.offline.backtest import BacktestReport

app = typer.Typer(help="Validate and test rule files.", no_args_is_help=True, add_completion=False)


@app.command("check")
def check(
    paths: list[Path] = typer.Argument(..., help="rule files or directories"),  # noqa: B008
    timezone: str = typer.Option("UTC", help="default timezone for rules without one (engine.timezone)"),
) -> None:
    """Validate rule files: every problem as `file:line: message`; exit 1 on any."""
    rules, problems = check_paths(paths, default_timezone=timezone)
    for p in problems:
        typer.echo(str(p))
    if problems:
        typer.echo(f"{len(problems)} problem(s)", err=True)
        raise typer.Exit(1)
    assert rules is not None
    typer.echo(f"ok: {len(rules)} rule(s) in {len(rules.files)} file(s)")


def test_files(paths: list[Path]) -> list[Path]:
    """Files as given; a directory contributes its *.test.yaml files, recursively."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out.extend(sorted(p.rglob("*.test.yaml")) + sorted(p.rglob("*.test.yml")))
        else:
            out.append(p)
    return out


@app.command("test")
def test(
    files: list[Path] = typer.Argument(..., help="rule test files (or directories of *.test.yaml)"),  # noqa: B008
) -> None:
    """Run rule tests on a virtual clock. Exit 0 all pass, 1 a test failed, 2 a file is invalid."""
    invalid = failed = passed = 0
    for f in test_files(files):
        outcome = run_test_file(f)
        if outcome.invalid:
            invalid += 1
            typer.echo(f"INVALID {f}")
            for p in outcome.problems:
                typer.echo(f"  {p}")
            continue
        typer.echo(f"{f}")
        for t in outcome.tests:
            if t.passed:
                passed += 1
                typer.echo(f"  PASS {t.name}")
            else:
                failed += 1
                typer.echo(f"  FAIL {t.name}")
                for failure in t.failures:
                    for line in failure.splitlines():
                        typer.echo(f"    {line}")
    typer.echo(f"{passed} passed, {failed} failed" + (f", {invalid} invalid file(s)" if invalid else ""))
    if invalid:
        raise typer.Exit(2)
    if failed:
        raise typer.Exit(1)


@app.command("backtest")
def rules_backtest(
    paths: Annotated[list[Path], typer.Argument(help="rule files or directories")],
    since: Annotated[str, typer.Option("--since", help="how far back to replay, e.g. 7d")] = "7d",
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    prometheus: Annotated[str | None, typer.Option(
        "--prometheus", help="instead of the event stream: readings rebuilt from dcgm-exporter's series at this "
        "Prometheus URL (as gpuevents import reads them)")] = None,
    selector: Annotated[str, typer.Option("--selector", help="with --prometheus: PromQL label matchers")] = "",
    step: Annotated[str, typer.Option("--step", help="with --prometheus: one reading per GPU this often")] = "60s",
    config: ConfigOption = None,
) -> None:
    """Replay the recorded event stream through rules: what would they have done? Nothing is run."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from gpuevents.clock import SystemClock
    from rules.offline.backtest import run_backtest

    seconds = duration_option(since, "--since")
    cfg = client_config(load_config_or_exit(config))
    if prometheus is not None:
        report = _from_prometheus(cfg, paths, prometheus, selector, seconds, duration_option(step, "--step"))
        _print_backtest(report, as_json)
        return
    bar = Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   console=Console(stderr=True), transient=True, disable=as_json)
    task = bar.add_task("replay", total=None)

    def advance(done: int, total: int) -> None:
        if done % 1000 == 0 or done == total:
            bar.update(task, completed=done, total=total)

    try:
        with bar:
            report = run_async(run_backtest(cfg, paths, seconds, SystemClock().now(), progress=advance))
    except LocatedError as e:
        for p in e.problems:
            typer.echo(str(p), err=True)
        raise typer.Exit(2) from None
    _print_backtest(report, as_json)


def _from_prometheus(cfg: Config, paths: list[Path], url: str, selector: str, seconds: float,
                     step_s: float) -> BacktestReport:
    """The backtest of readings rebuilt from dcgm-exporter's series over the last `seconds`."""
    import os
    from datetime import timedelta

    from gpuevents.clock import SystemClock
    from rules.history.promapi import PromClient, PromError, auth_header
    from rules.history.promimport import PromImport, rebuilt_events
    from rules.offline.backtest import backtest_events

    now = SystemClock().now()
    start = now - timedelta(seconds=seconds)
    plan = PromImport(url=url, since=start, until=now, step_s=step_s, selector=selector)
    try:
        client = PromClient(url, authorization=auth_header(os.environ))
    except PromError as e:
        raise typer.BadParameter(str(e), param_hint="--prometheus") from None
    note = ("readings rebuilt from dcgm-exporter's series: GPUs, their pods and memory; no processes, so rules on "
            "processes do not fire")
    try:
        return run_async(backtest_events(cfg, paths, rebuilt_events(cfg, client, plan), start, now, note))
    except PromError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    except LocatedError as e:
        for p in e.problems:
            typer.echo(str(p), err=True)
        raise typer.Exit(2) from None


def _print_backtest(report: BacktestReport, as_json: bool) -> None:
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
        return
    from rich.table import Table

    out = Console()
    out.print(f"replayed {report.events} events from {report.start:%Y-%m-%d %H:%M} to "
              f"{report.end:%Y-%m-%d %H:%M} UTC ({report.malformed} malformed skipped) at "
              f"{report.replay_events_per_s or 0:,.0f} events/s; nothing was run")
    if report.note:
        out.print(f"[yellow]note: {escape(report.note)}[/yellow]")
    summary = Table("rule", "would fire", "entities", "actions", "held/suppressed")
    for r in report.rules:
        summary.add_row(*cells(r.rule, str(r.fired), str(r.entities), str(r.actions_run),
                               str(r.actions_held_or_suppressed)))
    out.print(summary)
    detail = Table("fired at", "rule", "entity", "resolved at", "actions")
    for i in report.incidents:
        detail.add_row(*cells(f"{i.fired_at:%m-%d %H:%M:%S}", i.rule, i.entity_id,
                              f"{i.resolved_at:%m-%d %H:%M:%S}" if i.resolved_at else "still firing",
                              ", ".join(i.actions)))
    if report.incidents:
        out.print(detail)
