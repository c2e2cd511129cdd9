"""The `gpuevents` command line (DESIGN §6)."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from gpuevents.bus import BusError
from gpuevents.cli.agent import register_commands as register_agent_commands
from gpuevents.cli.report import report_command
from gpuevents.cli.rules import app as rules_app
from gpuevents.config import Config, load_config
from gpuevents.durations import DurationError, parse_duration
from gpuevents.server import ServerError
from gpuevents.yamlpos import Located, LocatedError, YamlDoc, parse_yaml

app = typer.Typer(
    name="gpuevents",
    help="Stop wasting GPUs: node agents publish GPU events to NATS; YAML rules act on them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")

err = Console(stderr=True)
ConfigOption = Annotated[
    Path | None, typer.Option("-c", "--config", help="config YAML (see config.example.yaml)")
]


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    logging.getLogger("nats").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def load_config_or_exit(path: Path | None) -> Config:
    """The config, or the problems as `file:line: key: problem` and exit 1."""
    try:
        return load_config(path)
    except LocatedError as e:
        for p in e.problems:
            typer.echo(str(p), err=True)
        raise typer.Exit(1) from None


@config_app.command("check")
def config_check(config: Annotated[Path, typer.Option("-c", "--config", help="config YAML")]) -> None:
    """Validate a config file: `file:line: key: problem`, exit 1 on errors."""
    cfg = load_config_or_exit(config)
    problems = unknown_limit_types(cfg, config)
    for p in problems:
        typer.echo(str(p), err=True)
    if problems:
        raise typer.Exit(1)
    typer.echo(f"{config}: ok")


def unknown_limit_types(cfg: Config, path: Path | None) -> list[Located]:
    """`engine.limits` keys that name no action type: a typo there silently removes a safety limit."""
    from actions import registry

    known = set(registry.types())
    unknown = [k for k in cfg.engine.limits if k not in known]
    if not unknown:
        return []
    doc = parse_yaml(path.read_text(), str(path)) if path is not None else YamlDoc(file="<env>", data={})
    return [doc.locate(("engine", "limits", k), f"engine.limits.{k}: unknown action type; known: "
                       f"{', '.join(sorted(known))}") for k in unknown]


def client_config(config: Config) -> Config:
    """For commands that talk to a running gpuevents: with no nats.url, the embedded server's address."""
    if config.nats.servers:
        return config
    e = config.nats.embedded
    url = f"nats://{e.host}:{e.port or 4222}"
    return config.model_copy(update={"nats": config.nats.model_copy(update={"url": url})})


def duration_option(text: str, option: str) -> float:
    """Seconds in a duration option, or a clear error and exit 2."""
    try:
        return parse_duration(text)
    except DurationError as e:
        typer.echo(f"error: {option} {e}", err=True)
        raise typer.Exit(2) from None


def run_async(coro: Any) -> Any:
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except (ServerError, BusError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


@app.command()
def up(
    config: ConfigOption = None,
    demo: Annotated[bool, typer.Option("--demo", help="demo rules with short durations; actions fire within a minute")] = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose")] = False,
) -> None:
    """Everything on one machine: embedded NATS (unless nats.url is set), the engine, action runners and a local agent."""
    from gpuevents.cli.run import run_up

    setup_logging(verbose)
    cfg = load_config_or_exit(config)
    run_async(run_up(cfg, demo=demo, echo=lambda m: typer.secho(m, fg="cyan", err=True)))


@app.command()
def engine(config: ConfigOption = None, verbose: Annotated[bool, typer.Option("-v", "--verbose")] = False) -> None:
    """The rules engine and its action runners (engine.runners of them)."""
    from gpuevents.cli.run import run_engine

    setup_logging(verbose)
    cfg = client_config(load_config_or_exit(config))
    if not cfg.engine.rules:
        typer.echo("error: engine.rules is empty: list rule files or directories in the config", err=True)
        raise typer.Exit(1)
    run_async(run_engine(cfg))


@app.command()
def runner(
    config: ConfigOption = None,
    count: Annotated[int, typer.Option("--count", min=1, help="runners in this process")] = 1,
    verbose: Annotated[bool, typer.Option("-v", "--verbose")] = False,
) -> None:
    """Action runners apart from the engine: they share GPUEVENTS_ACT as a queue."""
    from gpuevents.cli.run import run_runners

    setup_logging(verbose)
    run_async(run_runners(client_config(load_config_or_exit(config)), count))


@app.command()
def status(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the raw JSON")] = False,
) -> None:
    """The fleet now: nodes, GPUs, idle time, firing incidents (from the acting engine)."""
    from gpuevents.cli.client import show_status

    run_async(show_status(client_config(load_config_or_exit(config)), as_json))


@app.command()
def snooze(
    rule: Annotated[str, typer.Argument(help="rule name")],
    entity: Annotated[str, typer.Argument(help="entity id, e.g. node-7/gpu0")],
    for_: Annotated[str, typer.Option("--for", help="how long, e.g. 4h")],
    reason: Annotated[str, typer.Option("--reason")] = "",
    config: ConfigOption = None,
) -> None:
    """Exempt one entity from one rule for a while (stored in KV, audited)."""
    from gpuevents.cli.client import do_snooze

    seconds = duration_option(for_, "--for")
    run_async(do_snooze(client_config(load_config_or_exit(config)), rule, entity, seconds, reason))


@app.command()
def audit(
    rule: Annotated[str | None, typer.Option("--rule", help="only this rule")] = None,
    entity: Annotated[str | None, typer.Option("--entity", help="only this entity id")] = None,
    since: Annotated[str, typer.Option("--since", help="how far back, e.g. 1h, 7d")] = "1h",
    as_json: Annotated[bool, typer.Option("--json", help="one JSON record a line")] = False,
    config: ConfigOption = None,
) -> None:
    """What the engine did and why: transitions and action outcomes."""
    from gpuevents.cli.client import show_audit

    seconds = duration_option(since, "--since")
    run_async(show_audit(client_config(load_config_or_exit(config)), rule, entity, seconds, as_json))


def rules_backtest(
    paths: Annotated[list[Path], typer.Argument(help="rule files or directories")],
    since: Annotated[str, typer.Option("--since", help="how far back to replay, e.g. 7d")] = "7d",
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    config: ConfigOption = None,
) -> None:
    """Replay the recorded event stream through rules: what would they have done? Nothing is run."""
    from gpuevents.clock import SystemClock
    from rules.offline.backtest import run_backtest

    seconds = duration_option(since, "--since")
    cfg = client_config(load_config_or_exit(config))
    try:
        report = run_async(run_backtest(cfg, paths, seconds, SystemClock().now()))
    except LocatedError as e:
        for p in e.problems:
            typer.echo(str(p), err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
        return
    from rich.table import Table

    out = Console()
    out.print(f"replayed {report.events} events from {report.start:%Y-%m-%d %H:%M} to "
              f"{report.end:%Y-%m-%d %H:%M} UTC ({report.malformed} malformed skipped); nothing was run")
    summary = Table("rule", "would fire", "entities", "actions", "held/suppressed")
    for r in report.rules:
        summary.add_row(r.rule, str(r.fired), str(r.entities), str(r.actions_run),
                        str(r.actions_held_or_suppressed))
    out.print(summary)
    detail = Table("fired at", "rule", "entity", "resolved at", "actions")
    for i in report.incidents:
        detail.add_row(f"{i.fired_at:%m-%d %H:%M:%S}", i.rule, i.entity_id,
                       f"{i.resolved_at:%m-%d %H:%M:%S}" if i.resolved_at else "still firing",
                       ", ".join(i.actions))
    if report.incidents:
        out.print(detail)


# --- sub-commands (one registration line each) ---
register_agent_commands(app)  # gpuevents agent, gpuevents simulate
app.add_typer(rules_app, name="rules")  # gpuevents rules check|test
rules_app.command("backtest")(rules_backtest)  # gpuevents rules backtest
app.command("report")(report_command)  # gpuevents report


def main() -> None:
    app()


if __name__ == "__main__":
    main()
