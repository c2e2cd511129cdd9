"""Running a process's parts (engine, action runners, dashboard, agent) until Ctrl-C or SIGTERM, or until one
of them ends: then every part is told to stop, and a part that ended unexpectedly is named in the log."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuevents.aio import first_of, guarded_task, stop_tasks, unless_stopped
from gpuevents.bus import Bus
from gpuevents.cli.common import PartFailed
from gpuevents.clock import Clock
from gpuevents.config import Config
from gpuevents.ports import PortInUse, binding

if TYPE_CHECKING:
    from actions.runner import ActionRunner
    from actions.services import WeeklySummary
    from rules.engine.metrics import EngineMetrics
    from rules.engine.service import Engine

log = logging.getLogger("gpuevents")

Part = Callable[[asyncio.Event], Awaitable[Any]]
PART_STOP_S = 30.0  # how long the parts get to stop cleanly before they are cancelled


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


async def _part(name: str, run: Part, stop: asyncio.Event, failed: list[str], ports: list[PortInUse]) -> None:
    try:
        await run(stop)
    except PortInUse as e:  # said in one line by the command, not logged with a traceback
        failed.append(name)
        ports.append(e)
    except Exception:
        failed.append(name)
        raise
    finally:
        if not stop.is_set():
            if name not in failed:
                failed.append(name)
                log.error("%s ended before it was told to stop; shutting down", name)
            stop.set()


async def run_parts(parts: dict[str, Part], stop: asyncio.Event) -> None:
    """Run every part until `stop` is set (by a signal, or by a part that ends), then let them stop; raise
    PartFailed when one ended on its own."""
    failed: list[str] = []
    ports: list[PortInUse] = []
    tasks = [guarded_task(_part(name, run, stop, failed, ports), name) for name, run in parts.items()]
    try:
        await stop.wait()
    finally:
        stop.set()
        _, slow = await asyncio.wait(tasks, timeout=PART_STOP_S)
        await stop_tasks(slow, "stopping the parts")
    if ports:
        raise ports[0]
    if failed:
        raise PartFailed(f"{', '.join(failed)} stopped unexpectedly (see the log above)")


def start_metrics(port: int | None, registry: Any, addr: str = "0.0.0.0") -> Any:
    """/metrics on `addr`:`port` in a thread (config `engine.metrics_address`); the server, or None."""
    if port is None:
        return None
    from prometheus_client import start_http_server

    with binding("engine.metrics_port", addr, port):
        server, _ = start_http_server(port, addr=addr, registry=registry)
    log.info("metrics on http://%s:%d/metrics", addr, port)
    return server


def engine_parts(config: Config, bus: Bus, clock: Clock) -> dict[str, Part]:
    """The engine, its in-process action runners, its usage recorder and dashboard."""
    from actions import registry
    from rules.engine.metrics import EngineMetrics

    unknown = sorted(set(config.engine.limits) - set(registry.types()))
    if unknown:
        raise ValueError(f"engine.limits names unknown action types {unknown}; known: "
                         f"{', '.join(registry.types())} (run `gpuevents config check`)")
    metrics = EngineMetrics()
    start_metrics(config.engine.metrics_port, add_runner_metrics(metrics.registry), config.engine.metrics_address)
    engine = EnginePart(config, bus, clock, metrics)
    parts: dict[str, Part] = {"engine": engine}
    if any(site.jetstream_domain for site in config.nats.sites):
        from rules.engine.sites import SiteWatch

        parts["sites"] = SiteWatch(bus, clock).run  # each site linked or cut off; their stores set up
    parts.update(runner_parts(config, bus, clock, config.engine.runners))
    if config.engine.dashboard_port is not None:
        parts["dashboard"] = lambda stop: _dashboard(engine.opened, config, stop)
    return parts


class EnginePart:
    """The engine as a part (with `engine.partitions` > 1, a replica of one engine per partition): opened when
    the part starts, its rules loaded and its stores open; `opened` then hands its engines to the dashboard."""

    def __init__(self, config: Config, bus: Bus, clock: Clock, metrics: EngineMetrics) -> None:
        self.config = config
        self.bus = bus
        self.clock = clock
        self.metrics = metrics
        self.opened: asyncio.Future[list[Engine]] = asyncio.get_running_loop().create_future()

    async def __call__(self, stop: asyncio.Event) -> None:
        from rules.engine.service import Engine

        run: Part
        if self.config.engine.partitions > 1:
            from rules.engine.partitions.replica import EngineReplica

            replica = await EngineReplica.open(self.config, self.bus, clock=self.clock, metrics=self.metrics)
            engines, run = replica.engines, replica.run
        else:
            engine = await Engine.open(self.config, self.bus, clock=self.clock, metrics=self.metrics)
            engines, run = [engine], engine.run
        self.opened.set_result(engines)
        await run(stop)


def add_runner_metrics(registry: Any) -> Any:
    """Serve the runners' own metrics from `registry`: the claims they found contradicted
    (gpuevents_claims_contradicted_total, by node). The engine's registry gets them for its in-process runners."""
    from actions.claims import ContradictedClaims

    registry.register(ContradictedClaims())
    return registry


def runner_metrics() -> Any:
    """The registry a process of runners alone serves on /metrics."""
    from prometheus_client import CollectorRegistry

    return add_runner_metrics(CollectorRegistry())


@dataclass(frozen=True)
class RunnerPart:
    """One action runner as a part: opened (its services and ledger) when the part starts."""

    config: Config
    bus: Bus
    clock: Clock
    name: str
    report: WeeklySummary

    async def open(self) -> ActionRunner:
        from actions.runner import ActionRunner

        return await ActionRunner.open(self.bus, self.config, self.clock, name=self.name, report=self.report)

    async def __call__(self, stop: asyncio.Event) -> None:
        await (await self.open()).run(stop)


def runner_parts(config: Config, bus: Bus, clock: Clock, count: int) -> dict[str, Part]:
    """`count` action runners, each handed the visibility code its actions may need (the weekly summary)."""
    from gpuevents.cli.report import weekly_summary

    parts: dict[str, Part] = {
        f"runner{i}": RunnerPart(config, bus, clock, f"runner{i}", weekly_summary) for i in range(count)}
    if count > 0:
        parts.update(slack_click_parts(config, bus, clock))
    return parts


def slack_click_parts(config: Config, bus: Bus, clock: Clock) -> dict[str, Part]:
    """Where Slack's button clicks come in: Socket Mode with an app token, the HTTP endpoint with a port and a
    signing secret (DESIGN §5.1); none without them."""
    from actions import slack_transport

    slack = config.actions.slack
    parts: dict[str, Part] = {}
    if slack.app_token() and slack.token():

        async def socket_mode(stop: asyncio.Event) -> None:
            await slack_transport.run_socket_mode(config, bus, await bus.kv(), clock, stop)

        parts["slack-socket-mode"] = socket_mode
    if slack.interactivity_port is not None and slack.signing_secret() and slack.token():

        async def http(stop: asyncio.Event) -> None:
            await slack_transport.run_interactivity_server(config, bus, await bus.kv(), clock, stop)

        parts["slack-interactivity"] = http
    return parts


async def _dashboard(opened: asyncio.Future[list[Engine]], config: Config, stop: asyncio.Event) -> None:
    """The engine's dashboard, once its engines are open (not at all if `stop` comes first)."""
    from gpuevents.costs import CostModel
    from rules.dashboard.pages import bound_port, serve_dashboard
    from rules.dashboard.usage_source import UsageSource
    from rules.engine.read.dashboard_source import EngineDashboardSource

    if not await first_of(opened, stop):
        return
    engines = opened.result()
    usage = UsageSource(config.engine.usage_db, CostModel(config.costs),  # the rollups the engine writes
                        targets={name: t.target_util_pct for name, t in config.teams.items()})
    with binding("engine.dashboard_port", "127.0.0.1", config.engine.dashboard_port or 0):
        runner = await serve_dashboard(EngineDashboardSource(engines), "127.0.0.1", config.engine.dashboard_port or 0,
                                       usage)
    log.info("dashboard on http://127.0.0.1:%d/", bound_port(runner))
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


async def run_connected(config: Config, name: str, parts: Callable[[Bus], dict[str, Part]],
                        event_partitions: int | None = None, role: str = "admin") -> None:
    """Connect, make sure the streams exist (partitioned for the engines), run the parts until Ctrl-C or SIGTERM,
    close."""
    async with stop_on_signals() as stop:
        bus = Bus(config.nats, name=name, role=role)
        try:
            if not await connect_or_stop(bus, stop):
                return
            await bus.ensure_streams(event_partitions, config.cluster)
            await run_parts(parts(bus), stop)
        finally:
            await bus.close()


async def connect_or_stop(bus: Bus, stop: asyncio.Event) -> bool:
    """Connect, unless `stop` comes first (Ctrl-C or SIGTERM while NATS is out of reach): True when connected."""
    if await unless_stopped(bus.connect(), stop, "connecting to NATS"):
        return True
    log.info("stopped before NATS answered")
    return False
