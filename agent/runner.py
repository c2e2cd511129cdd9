"""The agent's shell: the sampling loop on a clock, publishing without blocking, the kill service, metrics."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from agent import kubenode
from agent.attribution import Attributor, PsutilControl, PsutilIdentifier
from agent.core import NodeCore
from agent.dcgmscrape import DcgmActivity
from agent.diagnose import Diagnostics
from agent.host import UserDb, in_host_pid_namespace
from agent.hpcjobs import JobMapping
from agent.idlestate import IdleStateFile
from agent.inputs import NodeInputs
from agent.jobdetails import JobDirectory
from agent.kill import KillHandler, KillPolicy, RateLimit
from agent.kubelet import PodDirectory
from agent.kubenode import KubeNodeInfo, NodeLookup
from agent.kubeowners import OwnerWalker
from agent.metrics import AgentCollector, AgentCounters, MetricsServer
from agent.powercap import CapFile, PowerCapper
from agent.sample import PowerControl, ProcessControl, Sampler
from agent.scenario import Scenario, load_scenario
from agent.simulate import SimulatedNode, fleet
from gpuevents import __version__
from gpuevents.aio import Backoff, guarded_task, restarting, sleep_or_stop, stop_tasks
from gpuevents.clock import Clock, SystemClock
from gpuevents.commands import POWER_CAP_VERB
from gpuevents.config import Config
from gpuevents.diagnose import DIAGNOSE_VERB
from gpuevents.events import AgentInfo, Event, make_event, new_id
from gpuevents.ports import binding
from gpuevents.subjects import command_subject

if TYPE_CHECKING:  # grpclib and protobuf are loaded only where the kubelet's PodResources API is used
    from agent.podresources.client import PodResources
    from gpuevents.bus import Handler, Subscription

log = logging.getLogger(__name__)


class EventBus(Protocol):
    """What the agent needs from `gpuevents.bus.Bus`."""

    @property
    def connected(self) -> bool: ...

    def publish_event(self, event: Event) -> None: ...

    async def serve(self, subject: str, handler: Handler, queue: str | None = None, *, concurrency: int = 1,
                    what: str = "request") -> Subscription: ...


class NodeAgent:
    """One node: its sampler, attribution, threshold core and kill handler. `tick(now)` is one sample."""

    def __init__(self, config: Config, sampler: Sampler, *, node: str | None = None,
                 control: ProcessControl | None = None, pods: PodDirectory | None = None,
                 hostname: str | None = None) -> None:
        a = config.agent
        self.config = config
        self.sampler = sampler
        self.node = node or a.node_name
        self.hostname = hostname or (self.node if isinstance(sampler, SimulatedNode) else socket.gethostname())
        self.core = NodeCore(
            node=self.node, cluster=config.cluster, thresholds=a.thresholds,
            snapshot_interval_s=a.snapshot_interval, labels=a.labels,
            driver_version=sampler.driver_version, hostname=self.hostname, agent_id=new_id(),
        )
        self.inputs = NodeInputs(labels=dict(a.labels))
        """What the core is told at the next sample besides its readings; the helpers replace it."""
        self.dcgm = DcgmActivity(a.dcgm) if a.dcgm.url else None
        """MIG instances' activity from a dcgm-exporter on the node, where GPM gives none."""
        self.attributor = Attributor(a.attribution, config.owners, pods.get if pods else None,
                                     team_label=config.costs.team_label)
        sim = sampler if isinstance(sampler, SimulatedNode) else None
        real = sim is None
        if control is None:
            control = PsutilControl(users=UserDb.for_host(a.attribution.passwd)) if sim is None else sim
        host_pids = in_host_pid_namespace() if real else True
        if not host_pids:
            log.warning("the agent is not in the host's pid namespace (run it with hostPID / --pid=host): kills are "
                        "refused, since NVML's pids may name other processes here")
        self.kill = kill = KillHandler(
            control=control,
            policy=KillPolicy(config.protect, agent_pid=os.getpid(), node_labels=a.labels, host_pids=host_pids),
            rate=RateLimit(a.kill.max_per_minute),
            holds_gpu=lambda p: self.core.holds_gpu(p.pid, p.create_time),
            pod_of=self._pod_of,
        )
        self.power = PowerCapper(sampler if isinstance(sampler, PowerControl) else None, self.core, kill.policy,
                                 RateLimit(a.power_cap.max_per_minute), dry_run=a.power_cap.dry_run,
                                 state=CapFile(a.state_dir, self.node) if a.state_dir is not None else None)
        self.power.recover()  # limits a crashed run left lowered
        self.diag = Diagnostics(a.diagnostics, state=Diagnostics.state_file(a.state_dir, self.node)
                                if a.state_dir is not None else None)
        self.inputs = replace(self.inputs, power_caps=self.power.cap_of, diag_fields=self.diag.fields)

    def apply_kubernetes_node(self, state: KubeNodeInfo) -> None:
        """The Node object's labels under the configured ones (config wins), and its cordon."""
        labels = {**state.labels, **self.config.agent.labels}
        self.inputs = replace(self.inputs, labels=labels, cordoned=state.cordoned)
        self.kill.policy.set_node_labels(labels)

    def _pod_of(self, pid: int) -> str | None:
        held = self.core.held_process(pid)
        return held.ident.pod if held else None

    def tick(self, now: datetime) -> list[Event]:
        """Sample, identify the pids NVML reported (cached), fold into the core; the events to publish."""
        reading = self.sampler.sample(now)
        if self.dcgm is not None:
            reading = self.dcgm.fill(reading, now)
        pids = {p.pid for p in reading.procs}
        identities = self.attributor.complete(self.sampler.identify(pids)) if pids else {}
        events = self.core.step(now, reading, identities, self.inputs)
        if self.power.caps:
            self.power.check()  # active again, or its holders changed: the limit goes back
        return events

    async def tick_async(self, now: datetime) -> list[Event]:
        if self.sampler.blocking or self.dcgm is not None:  # NVML, HTTP: they can stall; keep the loop free
            return await asyncio.to_thread(self.tick, now)
        return self.tick(now)

    def info(self) -> AgentInfo:
        a = self.config.agent
        return AgentInfo(node=self.node, version=__version__, sampler=self.sampler.kind,
                         hostname=self.hostname, pid=os.getpid(), agent_id=self.core.agent_id,
                         sample_interval_s=a.sample_interval, snapshot_interval_s=a.snapshot_interval)

    def lifecycle_event(self, type_: str, now: datetime) -> Event:
        return make_event(type_, self.node, self.info(), cluster=self.config.cluster, time=now)


# ------------------------------------------------------------------ samplers
class SamplerUnavailable(Exception):
    """No sampler can run here as configured; the message says why and what to do."""


def open_sampler(config: Config, *, simulate: bool = False, start: datetime | None = None) -> Sampler:
    """NVML where it loads (config `agent.sampler: auto|nvml`), else the simulated sampler when allowed."""
    from agent.nvml import NvmlSampler
    from agent.nvmlcalls import NvmlUnavailable

    a = config.agent
    if not simulate and a.sampler != "simulated":
        try:
            return NvmlSampler(identifier=PsutilIdentifier(a.attribution.cmdline_max,
                                                           users=UserDb.for_host(a.attribution.passwd)))
        except NvmlUnavailable as e:
            raise SamplerUnavailable(
                f"NVML is not available on this machine ({e}). Run on a node with an NVIDIA GPU and "
                "driver, or pass --simulate (or set agent.sampler: simulated) for a simulated node."
            ) from None
    sim = a.simulation
    return SimulatedNode(load_scenario(sim.scenario), node=a.node_name, gpus=sim.gpus_per_node,
                         seed=sim.seed, start=start or SystemClock().now(), speedup=sim.speedup)


# ------------------------------------------------------------------ loops
#: a helper task that fails is started again after this long, doubling up to the max
RESTART_BACKOFF_S = 1.0
RESTART_BACKOFF_MAX_S = 60.0
# Kill commands of a node answered at once, each in its own task: one can take its grace plus KILL_WAIT_S, and
# two for one GPU must not add up past the requester's timeout. The rest wait for a free slot.
KILL_CONCURRENCY = 32


def supervise(what: str, run: Callable[[], Awaitable[None]], stop: asyncio.Event,
              counters: AgentCounters | None = None) -> asyncio.Task[None]:
    """A task that runs `run()` until `stop` is set, starting it again (with a doubling backoff, counted in
    `counters.restarts`) whenever it fails or returns early."""

    def count(name: str) -> None:
        if counters is not None:
            counters.restarts[name] = counters.restarts.get(name, 0) + 1

    backoff = Backoff(RESTART_BACKOFF_S, RESTART_BACKOFF_MAX_S, jitter=False)
    return guarded_task(restarting(what, run, stop, backoff=backoff, healthy_after_s=RESTART_BACKOFF_MAX_S,
                                   on_restart=count), what)


async def _serve_kills(bus: EventBus, agents: list[NodeAgent], cluster: str, stop: asyncio.Event) -> None:
    """Subscribe each node's kill subject once NATS is reachable (nats-py resubscribes after reconnects),
    each command answered in its own task; runs until `stop`, unsubscribing whatever way it ends."""
    while not bus.connected:
        if await sleep_or_stop(stop, 0.2):
            return
    subs: list[Subscription] = []
    try:
        for a in agents:
            subs.append(await bus.serve(command_subject(cluster, a.node, "kill"), a.kill.answer,
                                        concurrency=KILL_CONCURRENCY, what="kill command"))
            subs.append(await bus.serve(command_subject(cluster, a.node, POWER_CAP_VERB), a.power.answer,
                                        concurrency=KILL_CONCURRENCY, what="power_cap command"))
            subs.append(await bus.serve(command_subject(cluster, a.node, DIAGNOSE_VERB), a.diag.answer,
                                        concurrency=1, what="diagnose command"))
        log.info("serving kill commands for %d node(s)", len(agents))
        await stop.wait()
    finally:
        for sub in subs:  # a restart must not leave a second subscription answering the same commands
            try:
                await sub.unsubscribe()  # and the commands still being answered are cancelled
            except Exception as e:
                log.debug("unsubscribing a kill subject: %r", e)
        for a in agents if stop.is_set() else ():  # the agent stops: a diagnostic under way ends with it
            await a.diag.close()


async def _watch_node(lookup: NodeLookup, agent: NodeAgent, stop: asyncio.Event) -> None:
    """Read the agent's Kubernetes node every `kubenode.REFRESH_S` and apply what it says."""
    try:
        while not stop.is_set():
            state = await lookup.refresh()
            if state is not None:
                agent.apply_kubernetes_node(state)
            await sleep_or_stop(stop, kubenode.REFRESH_S)
    finally:
        await lookup.close()


async def _watch_allocations(pr: PodResources, walker: OwnerWalker | None, agent: NodeAgent,
                             stop: asyncio.Event) -> None:
    """Ask the kubelet which pods hold which GPUs, resolve the new ones to their jobs, hand both to the core."""
    try:
        while not stop.is_set():
            pr.wanted = {h.ident.pod for h in agent.core.held.values() if h.ident.pod}
            delay = await pr.refresh()
            pods = pr.pods
            jobs = agent.inputs.kube_jobs
            if pods is not None and walker is not None:
                jobs = await walker.resolve_all(k for k, p in pods.items() if p.devices)
            agent.inputs = replace(agent.inputs, kube_pods=pods, kube_jobs=jobs)
            await sleep_or_stop(stop, delay)
    finally:
        # not asked any more (stopping, or restarted after a failure): unknown
        agent.inputs = replace(agent.inputs, kube_pods=None)
        pr.close()
        if walker is not None and stop.is_set():
            await walker.close()


async def _refresh_pods(pods: PodDirectory, stop: asyncio.Event) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            await pods.refresh(session)
            await sleep_or_stop(stop, pods.config.refresh)


def _job_directory(config: Config) -> JobDirectory | None:
    d = config.agent.hpc_job_mapping_dir
    if d is None:
        return None
    s = config.agent.slurm
    return JobDirectory(d, squeue=s.squeue if s.details else None, timeout_s=s.timeout)


async def _lookup_details(details: JobDirectory, counters: AgentCounters, stop: asyncio.Event) -> None:
    """Fill the details of new jobs (one squeue each), a second apart at most: never on the sampling path."""
    while not stop.is_set():
        await details.lookup_missing()
        counters.job_detail_failures = details.failures
        await sleep_or_stop(stop, 1.0)


def _start_helpers(agents: list[NodeAgent], bus: EventBus, config: Config, stop: asyncio.Event,
                   counters: AgentCounters, pods: PodDirectory | None, nodes: dict[str, NodeLookup] | None,
                   allocations: tuple[PodResources, OwnerWalker | None] | None,
                   details: JobDirectory | None) -> list[asyncio.Task[None]]:
    """Every helper task the agents need, each supervised: the kill service, and where configured the kubelet's
    pods and allocation, the Kubernetes nodes and the Slurm job details."""
    helpers = [supervise("kill service", lambda: _serve_kills(bus, agents, config.cluster, stop), stop, counters)]
    if pods is not None:
        helpers.append(supervise("kubelet pod refresh", lambda: _refresh_pods(pods, stop), stop, counters))
    if allocations is not None and agents:
        pr, walker = allocations
        helpers.append(supervise("kubelet pod resources", functools.partial(_watch_allocations, pr, walker, agents[0],
                                                                            stop), stop, counters))
    for a in agents:
        lookup = (nodes or {}).get(a.node)
        if lookup is not None:
            helpers.append(supervise("kubernetes node lookup", functools.partial(_watch_node, lookup, a, stop),
                                     stop, counters))
    if details is not None:
        helpers.append(supervise("slurm job details", functools.partial(_lookup_details, details, counters, stop),
                                 stop, counters))
    return helpers


def _start_metrics(agents: list[NodeAgent], config: Config, counters: AgentCounters) -> MetricsServer | None:
    if config.agent.metrics_port is None:
        return None
    collector = AgentCollector(lambda: [a.core for a in agents], counters,
                               process_labels=config.agent.metrics_process_labels)
    with binding("agent.metrics_port", config.agent.metrics_address, config.agent.metrics_port):
        return MetricsServer(collector, config.agent.metrics_port, config.agent.metrics_address).start()


def _idle_files(agents: list[NodeAgent], config: Config, clock: Clock) -> dict[str, IdleStateFile]:
    """Each node's file of idle clocks (config `agent.state_dir`), the clocks kept there handed to its core."""
    state_dir = config.agent.state_dir
    if state_dir is None:
        return {}
    files = {a.node: IdleStateFile(state_dir, a.node) for a in agents}
    carry_for = max(timedelta(minutes=5), 3 * timedelta(seconds=config.agent.snapshot_interval))
    for a in agents:
        a.core.carry_idle(files[a.node].load(clock.now(), carry_for))
    return files


async def _sample_loop(agents: list[NodeAgent], publish: Callable[[Event], None], *, config: Config, clock: Clock,
                       stop: asyncio.Event, counters: AgentCounters, mapping: JobMapping | None,
                       details: JobDirectory | None, idle_files: dict[str, IdleStateFile]) -> None:
    """Sample every agent each `sample_interval` until `stop` is set, with the scheduler's allocation as of
    each round; a slow round skips the ticks it missed."""
    interval = config.agent.sample_interval
    next_at = clock.monotonic()
    while not stop.is_set():
        job_gpus = mapping.jobs() if mapping is not None else None  # the scheduler's allocation, now
        if details is not None and job_gpus is not None:
            details.observe({j for jobs in job_gpus.values() for j in jobs})
        for a in agents:
            a.inputs = replace(a.inputs, job_gpus=job_gpus, job_details=details.get if details is not None else None)
            try:
                events = await a.tick_async(clock.now())
            except Exception:
                counters.sample_errors += 1
                log.exception("sampling node %s failed; trying again next interval", a.node)
                continue
            for e in events:
                publish(e)
                if e.type == "node.snapshot" and a.node in idle_files:
                    idle_files[a.node].save(clock.now(), a.core.idle_clocks())
        counters.samples += 1
        next_at += interval
        delay = next_at - clock.monotonic()
        if delay < 0:  # fell behind (a slow sample): skip the missed ticks, do not burst
            next_at = clock.monotonic()
            delay = 0.0
        await sleep_or_stop(stop, delay)


async def run_nodes(agents: list[NodeAgent], bus: EventBus, *, config: Config, clock: Clock,
                    stop: asyncio.Event, counters: AgentCounters | None = None,
                    pods: PodDirectory | None = None,
                    nodes: dict[str, NodeLookup] | None = None,
                    allocations: tuple[PodResources, OwnerWalker | None] | None = None) -> AgentCounters:
    """Sample every agent each `sample_interval` until `stop` is set; publishing never blocks the loop."""
    counters = counters or AgentCounters()
    metrics = _start_metrics(agents, config, counters)
    mapping = JobMapping(config.agent.hpc_job_mapping_dir) if config.agent.hpc_job_mapping_dir is not None else None
    details = _job_directory(config) if mapping is not None else None
    helpers = _start_helpers(agents, bus, config, stop, counters, pods, nodes, allocations, details)

    def publish(event: Event) -> None:
        bus.publish_event(event)
        counters.count_event(event.type)

    idle_files = _idle_files(agents, config, clock)
    try:
        for a in agents:
            publish(a.lifecycle_event("agent.started", clock.now()))
        await _sample_loop(agents, publish, config=config, clock=clock, stop=stop, counters=counters,
                           mapping=mapping, details=details, idle_files=idle_files)
        for a in agents:
            publish(a.lifecycle_event("agent.stopping", clock.now()))
    finally:
        await stop_tasks(helpers, "agent helpers")
        if metrics is not None:
            metrics.stop()
        for a in agents:
            a.power.restore_all("the agent stops")
            a.sampler.close()
    return counters


async def run_agent(config: Config, bus: EventBus, clock: Clock | None = None,
                    sampler: Sampler | None = None, stop_event: asyncio.Event | None = None) -> AgentCounters:
    """One node agent until `stop_event`; the sampler is opened from config when not given."""
    clock = clock or SystemClock()
    stop = stop_event or asyncio.Event()
    sampler = sampler or open_sampler(config, start=clock.now())
    kcfg = config.agent.attribution.kubelet
    pods = PodDirectory(kcfg) if kcfg.url else None
    agent = NodeAgent(config, sampler, pods=pods)
    log.info("agent for node %s: %s sampler, %d GPU(s) known at start", agent.node, sampler.kind,
             len(getattr(sampler, "devices", [])) or getattr(sampler, "gpu_count", 0))
    nodes = {agent.node: NodeLookup(config, agent.node)} if kubenode.wanted(config) else None
    return await run_nodes([agent], bus, config=config, clock=clock, stop=stop, pods=pods, nodes=nodes,
                           allocations=open_allocations(config))


def open_allocations(config: Config) -> tuple[PodResources, OwnerWalker | None] | None:
    """The kubelet's PodResources client and the owner walk, as config `agent.pod_resources` and
    `agent.kubernetes_jobs` say (unset: on when the agent runs in a Kubernetes pod)."""
    prc = config.agent.pod_resources
    on = prc.enabled if prc.enabled is not None else kubenode.in_pod()
    if not on:
        return None
    from agent.podresources.client import PodResources

    pr = PodResources(prc.socket, prc.resources, refresh_s=prc.refresh, timeout_s=prc.timeout)
    jc = config.agent.kubernetes_jobs
    if not (jc.owners if jc.owners is not None else True):
        return pr, OwnerWalker(None, jc)
    from agent.kubeapi import open_fetch
    from gpuevents.kube import KubeConfigError

    try:
        fetch, close = open_fetch(config.actions.kubernetes)
    except KubeConfigError as e:
        log.warning("%s: pods are reported as their own jobs (no owner walk)", e)
        return pr, OwnerWalker(None, jc)
    return pr, OwnerWalker(fetch, jc, close=close)


def simulated_agents(config: Config, *, nodes: int, gpus_per_node: int,
                     scenario: str | Path | Scenario | None = None, seed: int | None = None,
                     speedup: float | None = None, start: datetime, prefix: str = "sim-") -> list[NodeAgent]:
    sim = config.agent.simulation
    sc = scenario if isinstance(scenario, Scenario) else load_scenario(scenario or sim.scenario)
    samplers = fleet(sc, nodes=nodes, gpus_per_node=gpus_per_node,
                     seed=sim.seed if seed is None else seed, start=start,
                     speedup=sim.speedup if speedup is None else speedup, prefix=prefix)
    return [NodeAgent(config, s, node=s.node) for s in samplers]


async def run_simulated_fleet(config: Config, bus: EventBus, nodes: int, gpus_per_node: int,
                              scenario: str | Path | Scenario | None = None,
                              stop_event: asyncio.Event | None = None, *, seed: int | None = None,
                              speedup: float | None = None, clock: Clock | None = None) -> AgentCounters:
    """`nodes` simulated agents in this process, each its own node, until `stop_event`."""
    clock = clock or SystemClock()
    agents = simulated_agents(config, nodes=nodes, gpus_per_node=gpus_per_node, scenario=scenario,
                              seed=seed, speedup=speedup, start=clock.now())
    log.info("simulating %d node(s) x %d GPU(s)", nodes, gpus_per_node)
    return await run_nodes(agents, bus, config=config, clock=clock, stop=stop_event or asyncio.Event())
