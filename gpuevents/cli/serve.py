"""`gpuevents up`, `engine` and `runner`: the processes that run gpuevents' parts."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from gpuevents.bus import Bus
from gpuevents.cli.common import (
    ConfigOption,
    VerboseOption,
    client_config,
    load_config_or_exit,
    run_async,
    setup_logging,
)
from gpuevents.cli.parts import (
    connect_or_stop,
    engine_parts,
    run_connected,
    run_parts,
    runner_metrics,
    runner_parts,
    start_metrics,
    stop_on_signals,
)
from gpuevents.clock import Clock, SystemClock
from gpuevents.config import Config
from gpuevents.server import EmbeddedServer, ServerError

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
DEMO_RULES = PACKAGE_ROOT / "rules" / "library" / "demo"


def up(
    config: ConfigOption = None,
    demo: Annotated[bool,
                    typer.Option("--demo",
                                 help="demo rules with short durations; actions fire within a minute")] = False,
    verbose: VerboseOption = False,
) -> None:
    """Everything on one machine: embedded NATS (unless nats.url is set), the engine, action runners and a local
    agent."""
    setup_logging(verbose)
    cfg = load_config_or_exit(config)
    run_async(run_up(cfg, demo=demo, echo=lambda m: typer.secho(m, fg="cyan", err=True)))


def engine(config: ConfigOption = None, verbose: VerboseOption = False) -> None:
    """The rules engine and its action runners (engine.runners of them)."""
    setup_logging(verbose)
    cfg = _with_nats_url(load_config_or_exit(config))
    if not cfg.engine.rules:
        typer.echo("error: engine.rules is empty: list rule files or directories in the config", err=True)
        raise typer.Exit(1)
    rules_or_exit(cfg)
    run_async(run_engine(cfg))


def rules_or_exit(config: Config) -> None:
    """Load and check the rule files before connecting anywhere: problems as `file:line: message`, exit 1."""
    from gpuevents.yamlpos import LocatedError
    from rules.intake.check import load_checked

    try:
        load_checked(config.engine.rules, config.engine.timezone, config)
    except LocatedError as e:
        typer.echo("error: the rule files do not load (gpuevents rules check says the same):", err=True)
        for p in e.problems:
            typer.echo(str(p), err=True)
        raise typer.Exit(1) from None


def runner(
    config: ConfigOption = None,
    count: Annotated[int, typer.Option("--count", min=1, help="runners in this process")] = 1,
    verbose: VerboseOption = False,
) -> None:
    """Action runners apart from the engine: they share GPUEVENTS_ACT as a queue."""
    setup_logging(verbose)
    run_async(run_runners(_with_nats_url(load_config_or_exit(config)), count))


def _with_nats_url(cfg: Config) -> Config:
    """The config with nats.url; without one, the embedded server's address, and a line saying so."""
    if not cfg.nats.servers:
        cfg = client_config(cfg)
        typer.secho(f"nats.url is not set: trying {cfg.nats.url}, where `gpuevents up` runs its embedded NATS. "
                    "Set nats.url (or GPUEVENTS_NATS__URL) to your NATS servers.", fg="yellow", err=True)
    return cfg


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("engine")(engine)
    app.command("runner")(runner)


async def run_engine(config: Config, clock: Clock | None = None) -> None:
    clock = clock or SystemClock()
    await run_connected(config, f"engine-{config.cluster}", lambda bus: engine_parts(config, bus, clock),
                        event_partitions=config.engine.partitions, role="engine")


async def run_runners(config: Config, count: int, clock: Clock | None = None) -> None:
    clock = clock or SystemClock()
    start_metrics(config.engine.metrics_port, runner_metrics(), config.engine.metrics_address)
    await run_connected(config, f"runner-{config.cluster}", lambda bus: runner_parts(config, bus, clock, count),
                        role="runner")


def demo_config(config: Config) -> Config:
    """The demo: the short demo rules, a simulated node that holds a GPU idle, the dashboard on."""
    data = config.model_dump()
    port = 8080 if config.engine.dashboard_port is None else config.engine.dashboard_port
    data["engine"].update(rules=[DEMO_RULES], tick=5, dashboard_port=port)
    data["agent"].update(sampler="simulated", snapshot_interval=5)
    data["agent"]["simulation"].update(scenario="demo")
    return Config.model_validate(data)


NO_RULES_HINT = ("No rules given, so nothing will fire: list rule files in a config and pass it with -c "
                 "(engine: {rules: [rules/library]}; see docs/rules.md), or watch the demo: gpuevents up --demo")


def no_rules_config(config: Config) -> Config:
    """Plain `up` with no rules: the dashboard on anyway, at 8080 (any free port when 8080 is taken)."""
    if config.engine.rules or config.engine.dashboard_port is not None:
        return config
    with socket.socket() as sock:
        taken = sock.connect_ex(("127.0.0.1", 8080)) == 0
    engine = config.engine.model_copy(update={"dashboard_port": 0 if taken else 8080})
    return config.model_copy(update={"engine": engine})


def see_it_lines(config: Config) -> list[str]:
    """The banner's pointers: the dashboard, and how to see free GPUs, usage so far and a simulated past."""
    port = config.engine.dashboard_port
    url = f"http://127.0.0.1:{port}/" if port else "the dashboard's address (in the log)"
    return [
        f"Dashboard: {url}  · office wall screen: {url.rstrip('/')}/wall" if port else f"Dashboard: {url}",
        "Which GPU is free for my job?  gpuevents free   (or --json; the dashboard's GET /api/free)",
        "Usage so far, this hour included:  gpuevents report --format html -o report.html",
        "A simulated past to look at (two weeks, for week over week):  gpuevents simulate --history 14d",
    ]


async def run_up(config: Config, *, demo: bool = False, echo: Callable[[str], None] = print) -> None:
    """Embedded NATS (unless nats.url is set), the engine and runners, and a local agent."""
    from agent.runner import SamplerUnavailable, open_sampler, run_agent

    if demo:
        config = demo_config(config)
    elif not config.engine.rules:
        echo(NO_RULES_HINT)
        config = no_rules_config(config)
    clock = SystemClock()
    server: EmbeddedServer | None = None
    if not config.nats.servers:
        server = EmbeddedServer(config.nats.embedded)
        try:
            server.start()
        except ServerError as e:
            if "already listens" not in str(e):
                raise
            server = EmbeddedServer(config.nats.embedded.model_copy(update={"port": 0}))
            server.start()
            echo(f"port {config.nats.embedded.port} is taken; the embedded NATS uses {server.port}")
        config = config.model_copy(update={"nats": config.nats.model_copy(update={"url": server.url})})
        echo(f"NATS (embedded, JetStream in {server.data_dir}) listens on {server.url}")
    else:
        echo(f"NATS: {', '.join(config.nats.servers)}")
    try:
        try:
            sampler = open_sampler(config, simulate=config.agent.sampler == "simulated",
                                   start=clock.now())
        except SamplerUnavailable as e:
            echo(f"No GPU here ({e}): a simulated node stands in for the local agent.")
            sampler = open_sampler(config, simulate=True, start=clock.now())
        if sampler.kind != "nvml":
            echo(f"Agent: SIMULATED node {config.agent.node_name!r} "
                 f"(scenario {config.agent.simulation.scenario!r}), not real GPUs.")
        rules = ", ".join(map(str, config.engine.rules)) or "none"
        echo(f"Engine: rules from {rules}; Ctrl-C stops everything.")
        if config.engine.dashboard_port is not None:
            for line in see_it_lines(config):
                echo(line)
        async with stop_on_signals() as stop:
            bus = Bus(config.nats, name="gpuevents-up")
            try:
                if not await connect_or_stop(bus, stop):
                    return
                await bus.ensure_streams(config.engine.partitions, config.cluster)
                parts = engine_parts(config, bus, clock)
                parts["agent"] = lambda s: run_agent(config, bus, clock, sampler=sampler, stop_event=s)
                await run_parts(parts, stop)
            finally:
                await bus.close()
    finally:
        if server is not None:
            server.stop()
            echo("embedded NATS stopped")
