"""Running the parts: the engine with its action runners, extra runners, and `up` (everything in one process)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from gpuevents.bus import Bus
from gpuevents.clock import Clock, SystemClock
from gpuevents.config import Config
from gpuevents.server import EmbeddedServer, ServerError

log = logging.getLogger("gpuevents")

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
DEMO_RULES = PACKAGE_ROOT / "rules" / "library" / "demo"


@contextlib.asynccontextmanager
async def stop_on_signals() -> AsyncIterator[asyncio.Event]:
    """An event set by Ctrl-C or SIGTERM, so every part can stop cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        yield stop
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def _guarded(name: str, coro: Awaitable[Any], stop: asyncio.Event) -> None:
    """Run one part; if it ends unexpectedly, say so and stop the others."""
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("%s stopped unexpectedly; shutting down", name)
        stop.set()
        raise
    if not stop.is_set():
        log.error("%s finished unexpectedly; shutting down", name)
        stop.set()


async def run_parts(parts: dict[str, Callable[[asyncio.Event], Awaitable[Any]]],
                    stop: asyncio.Event) -> None:
    tasks = [asyncio.create_task(_guarded(n, p(stop), stop), name=n) for n, p in parts.items()]
    try:
        await stop.wait()
    finally:
        results = await asyncio.gather(*tasks, return_exceptions=True)
    for name, r in zip(parts, results, strict=True):
        if isinstance(r, Exception):
            log.debug("%s ended with %r", name, r)


def start_metrics(port: int | None, registry: Any) -> None:
    if port is None:
        return
    from prometheus_client import start_http_server

    start_http_server(port, registry=registry)
    log.info("metrics on http://0.0.0.0:%d/metrics", port)


def engine_parts(config: Config, bus: Bus, clock: Clock) -> dict[str, Callable[[asyncio.Event], Awaitable[Any]]]:
    """The engine, its in-process action runners, its usage recorder and dashboard."""
    from actions import registry
    from actions.runner import ActionRunner
    from gpuevents.cli.report import weekly_summary
    from rules.engine.service import Engine

    unknown = sorted(set(config.engine.limits) - set(registry.types()))
    if unknown:
        raise ValueError(f"engine.limits names unknown action types {unknown}; known: "
                         f"{', '.join(registry.types())} (run `gpuevents config check`)")
    engine = Engine(config, bus, clock=clock)
    start_metrics(config.engine.metrics_port, engine.metrics.registry)
    parts: dict[str, Callable[[asyncio.Event], Awaitable[Any]]] = {"engine": engine.run}
    for i in range(config.engine.runners):
        runner = ActionRunner(bus, config, clock, name=f"runner{i}", report=weekly_summary)
        parts[f"runner{i}"] = runner.run
    if config.engine.dashboard_port is not None:
        parts["dashboard"] = lambda stop: _dashboard(engine, config.engine.dashboard_port or 0, stop)
    return parts


async def _dashboard(engine: Any, port: int, stop: asyncio.Event) -> None:
    from rules.engine.status import EngineDashboardSource
    from rules.visibility.dashboard import bound_port, serve_dashboard

    runner = await serve_dashboard(EngineDashboardSource(engine), "127.0.0.1", port)
    log.info("dashboard on http://127.0.0.1:%d/", bound_port(runner))
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


async def _run_connected(config: Config, name: str,
                         parts: Callable[[Bus], dict[str, Callable[[asyncio.Event], Awaitable[Any]]]]) -> None:
    """Connect, make sure the streams exist, run the parts until Ctrl-C or SIGTERM, close."""
    async with stop_on_signals() as stop:
        bus = Bus(config.nats, name=name)
        await bus.connect()
        try:
            await bus.ensure_streams()
            await run_parts(parts(bus), stop)
        finally:
            await bus.close()


async def run_engine(config: Config, clock: Clock | None = None) -> None:
    clock = clock or SystemClock()
    await _run_connected(config, f"engine-{config.cluster}", lambda bus: engine_parts(config, bus, clock))


async def run_runners(config: Config, count: int, clock: Clock | None = None) -> None:
    from actions.runner import ActionRunner
    from gpuevents.cli.report import weekly_summary

    clock = clock or SystemClock()
    await _run_connected(config, f"runner-{config.cluster}", lambda bus: {
        f"runner{i}": ActionRunner(bus, config, clock, name=f"runner{i}", report=weekly_summary).run
        for i in range(count)})


def demo_config(config: Config) -> Config:
    """The demo: the short demo rules, a simulated node that holds a GPU idle, the dashboard on."""
    data = config.model_dump()
    port = 8080 if config.engine.dashboard_port is None else config.engine.dashboard_port
    data["engine"].update(rules=[DEMO_RULES], tick=5, dashboard_port=port)
    data["agent"].update(sampler="simulated", snapshot_interval=5)
    data["agent"]["simulation"].update(scenario="demo")
    return Config.model_validate(data)


async def run_up(config: Config, *, demo: bool = False, echo: Callable[[str], None] = print) -> None:
    """Embedded NATS (unless nats.url is set), the engine and runners, and a local agent."""
    from agent.runner import SamplerUnavailable, open_sampler, run_agent

    if demo:
        config = demo_config(config)
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
        async with stop_on_signals() as stop:
            bus = Bus(config.nats, name="gpuevents-up")
            await bus.connect()
            try:
                await bus.ensure_streams()
                parts = engine_parts(config, bus, clock)
                parts["agent"] = lambda s: run_agent(config, bus, clock, sampler=sampler, stop_event=s)
                await run_parts(parts, stop)
            finally:
                await bus.close()
    finally:
        if server is not None:
            server.stop()
            echo("embedded NATS stopped")
