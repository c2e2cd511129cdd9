"""`gpuevents agent` and `gpuevents simulate`: the node agent, and simulated agents for demos and load."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Annotated

import typer

from gpuevents.aio import guarded_task, sleep_or_stop
from gpuevents.cli.common import (
    ConfigOption,
    VerboseOption,
    client_config,
    duration_option,
    load_config_or_exit,
    run_async,
    setup_logging,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from agent.runner import NodeAgent
    from agent.sample import Sampler
    from gpuevents.bus import Bus
    from gpuevents.config import Config

log = logging.getLogger("gpuevents.agent")



def agent(
    config: ConfigOption = None,
    simulate: Annotated[bool, typer.Option(
        "--simulate", help="a simulated node (agent.simulation) instead of NVML")] = False,
    verbose: VerboseOption = False,
) -> None:
    """The node agent: samples GPUs through NVML, publishes events, answers kill commands."""
    from agent.runner import SamplerUnavailable, open_sampler
    from gpuevents.clock import SystemClock
    from gpuevents.yamlpos import LocatedError

    setup_logging(verbose)
    cfg = client_config(load_config_or_exit(config))
    try:
        sampler = open_sampler(cfg, simulate=simulate, start=SystemClock().now())
    except SamplerUnavailable as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    except LocatedError as e:
        typer.echo(f"error: agent.simulation.scenario: {e}", err=True)
        raise typer.Exit(1) from None
    if sampler.kind == "simulated":
        cfg = _simulated_name(cfg)
        sampler = open_sampler(cfg, simulate=True, start=SystemClock().now())
        sim = cfg.agent.simulation
        typer.secho(f"Agent: SIMULATED node {cfg.agent.node_name!r} ({sim.gpus_per_node} GPUs, scenario "
                    f"{sim.scenario!r}); no real GPU is read.", fg="yellow", err=True)
    run_async(_run_one(cfg, sampler))


def simulate(
    nodes: Annotated[int | None, typer.Option(
        "--nodes", min=1, help="simulated nodes, each its own agent [default: agent.simulation.nodes]")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(
        "--gpus-per-node", min=1, max=64, help="[default: agent.simulation.gpus_per_node]")] = None,
    scenario: Annotated[str | None, typer.Option(
        "--scenario", help="a shipped scenario (demo, mixed, steady, idle-heavy) or a YAML file")] = None,
    config: ConfigOption = None,
    seed: Annotated[int | None, typer.Option("--seed", help="default agent.simulation.seed")] = None,
    speedup: Annotated[float | None, typer.Option("--speedup", help="times faster than real time")] = None,
    run_for: Annotated[str | None, typer.Option("--for", help="stop after this long (e.g. 10m)")] = None,
    history: Annotated[str | None, typer.Option(
        "--history", help="instead: write this much simulated past usage (e.g. 7d, 14d for week over week) to "
        "engine.usage_db and exit")] = None,
    verbose: VerboseOption = False,
) -> None:
    """Simulated agents publishing to the bus, for demos and load tests; or, with --history, a simulated past of
    usage for reports and the dashboard's heatmap."""
    from agent.runner import simulated_agents
    from gpuevents.clock import SystemClock
    from gpuevents.yamlpos import LocatedError

    setup_logging(verbose)
    cfg = client_config(load_config_or_exit(config))
    seconds = duration_option(run_for, "--for") if run_for is not None else None
    nodes = nodes or cfg.agent.simulation.nodes
    gpus_per_node = gpus_per_node or cfg.agent.simulation.gpus_per_node
    if history is not None:
        _write_history(cfg, duration_option(history, "--history"), nodes, gpus_per_node,
                       cfg.agent.simulation.seed if seed is None else seed)
        return
    try:
        agents = simulated_agents(cfg, nodes=nodes, gpus_per_node=gpus_per_node, scenario=scenario,
                                  seed=seed, speedup=speedup, start=SystemClock().now())
    except LocatedError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    prefix = free_prefix("sim-", run_async(names_in_use(cfg)))
    if prefix != "sim-":  # another simulation runs: these nodes take names of their own
        typer.secho(f"sim-* nodes are already reported: these are named {prefix}*", fg="yellow", err=True)
        agents = simulated_agents(cfg, nodes=nodes, gpus_per_node=gpus_per_node, scenario=scenario,
                                  seed=seed, speedup=speedup, start=SystemClock().now(), prefix=prefix)
    typer.secho(f"Simulating {nodes} node(s) x {gpus_per_node} GPU(s), scenario "
                f"{scenario or cfg.agent.simulation.scenario!r}, cluster {cfg.cluster!r}.", fg="yellow", err=True)
    run_async(_run_many(cfg, agents, seconds))


def free_name(wanted: str, used: set[str]) -> str:
    """`wanted`, or `wanted-2`, `wanted-3`, … : the first no agent reports as now."""
    name, n = wanted, 1
    while name in used:
        n += 1
        name = f"{wanted}-{n}"
    return name


def free_prefix(prefix: str, used: set[str]) -> str:
    """`sim-`, or `sim2-`, `sim3-`, … : the first prefix no online node name starts with."""
    stem, n = prefix.rstrip("-"), 1
    while any(u.startswith(prefix) for u in used):
        n += 1
        prefix = f"{stem}{n}-"
    return prefix


async def names_in_use(cfg: Config) -> set[str]:
    """The node names an engine sees online in this cluster now; empty when no engine answers."""
    from gpuevents.bus import Bus, BusError
    from gpuevents.cli.ask_status import ask_pages
    from gpuevents.wire.status import StatusError

    names: set[str] = set()
    try:
        async with asyncio.timeout(float(cfg.nats.connect_timeout) + 30), \
                Bus(cfg.nats, name="gpuevents-names") as bus:
            async for page in ask_pages(bus, timeout=2):  # every node once, a page at a time
                names |= {n.name for n in page.nodes if n.online and n.cluster == cfg.cluster}
    except StatusError:
        return set()  # no engine answers
    except (BusError, TimeoutError, OSError) as e:
        log.info("could not ask the engine which node names are in use (%s); assuming none", e)
        return set()
    return names


def _has_identity(cfg: Config) -> bool:
    """The agent connects as a user of its own (a credentials file, NATS_USER, or a user in the URL), as in
    production."""
    import os

    return (cfg.nats.creds_file is not None or bool(os.environ.get("NATS_USER"))
            or any("@" in url.partition("://")[2] for url in cfg.nats.servers))


def _simulated_name(cfg: Config) -> Config:
    """A simulated agent never takes a name in use: by default `<host>-sim` (the local `up` is `<host>`), or the
    next free `-2`, `-3`; a name given in the config that is in use is refused."""
    import socket

    given = cfg.agent.node_name != socket.gethostname()
    if given and _has_identity(cfg):
        return cfg  # a node's own NATS identity: the server lets it publish as that node only, and ask nothing
    used = run_async(names_in_use(cfg))
    if given:
        if cfg.agent.node_name in used:
            typer.echo(f"error: node {cfg.agent.node_name!r} is already reported by an agent; a simulated node under "
                       "its name would overwrite its events. Give another agent.node_name "
                       "(GPUEVENTS_AGENT__NODE_NAME=...)", err=True)
            raise typer.Exit(1)
        return cfg
    name = free_name(f"{socket.gethostname()}-sim", used)
    return cfg.model_copy(update={"agent": cfg.agent.model_copy(update={"node_name": name})})


def _write_history(cfg: Config, seconds: float, nodes: int, gpus_per_node: int, seed: int) -> None:
    from gpuevents.cli.history import write_history
    from gpuevents.clock import SystemClock
    from gpuevents.durations import format_duration

    try:
        done = write_history(cfg, seconds=seconds, nodes=nodes, gpus_per_node=gpus_per_node, seed=seed,
                             now=SystemClock().now())
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    shown = ", ".join(done.nodes[:3]) + (f" and {len(done.nodes) - 3} more" if len(done.nodes) > 3 else "")
    typer.secho(f"Wrote {format_duration(seconds)} of SIMULATED usage for {shown} ({gpus_per_node} GPUs each): "
                f"{done.hours} node-hours and {done.jobs} job summaries to {cfg.engine.usage_db}"
                + (f"; {done.skipped} node-hours already had usage and were left alone" if done.skipped else "")
                + ".", fg="yellow", err=True)
    typer.echo("See it: gpuevents report --format html -o report.html, gpuevents report --weeks 13, "
               "gpuevents rightsize, gpuevents jobs (or the dashboard)", err=True)


def register(app: typer.Typer) -> None:
    app.command("agent")(agent)
    app.command("simulate")(simulate)


# ------------------------------------------------------------------ async parts
@contextlib.asynccontextmanager
async def _bus_and_stop(cfg: Config, name: str, role: str = "admin",
                        node: str | None = None) -> AsyncIterator[tuple[Bus, asyncio.Event]]:
    from gpuevents.bus import Bus
    from gpuevents.cli.parts import stop_on_signals

    bus = Bus(cfg.nats, name=name, role=role, node=node, cluster=cfg.cluster)
    # sampling starts at once; events buffer until NATS answers and a stream stores them. Agents never create
    # streams (DESIGN §9): the engine does, on the hub and in each site's JetStream domain.
    await bus.connect(wait=False)
    try:
        async with stop_on_signals() as stop:
            yield bus, stop
    finally:
        await bus.close(flush_timeout=5)


async def _stop_after(stop: asyncio.Event, seconds: float | None) -> None:
    if seconds is not None:
        await sleep_or_stop(stop, seconds)
        stop.set()


async def _run_one(cfg: Config, sampler: Sampler) -> None:
    from agent.runner import run_agent

    async with _bus_and_stop(cfg, f"agent-{cfg.agent.node_name}", "agent", cfg.agent.node_name) as (bus, stop):
        await run_agent(cfg, bus, sampler=sampler, stop_event=stop)


async def _run_many(cfg: Config, agents: list[NodeAgent], seconds: float | None) -> None:
    from agent.runner import run_nodes
    from gpuevents.clock import SystemClock

    async with _bus_and_stop(cfg, "gpuevents-simulate") as (bus, stop):
        timer = guarded_task(_stop_after(stop, seconds), "the --for timer")
        counters = await run_nodes(agents, bus, config=cfg, clock=SystemClock(), stop=stop)
        await timer
        if not await bus.flush(10):
            log.warning("%s events not yet delivered at exit", getattr(bus.stats, "buffered", "some"))
        log.info("%d samples, %s events", counters.samples, sum(counters.events.values()))
