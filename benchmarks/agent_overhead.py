"""Agent overhead: one simulated 8-GPU node with 16 processes, sampled every second; CPU and memory of the agent.

    python benchmarks/agent_overhead.py --json             # 60 s, as the issue asks
    python benchmarks/agent_overhead.py --seconds 10 --json
    python benchmarks/agent_overhead.py --json --metrics --scrape 1 --scenario hopper-mig --kubelet  # everything on

Publishes to a real nats-server (started here, a separate process that is not measured) unless
`--no-nats`. CPU is the process's user+system time from getrusage over the measured window, as a
percentage of one core; memory is the resident set at the end and the peak. With `--scrape S`, a
separate process (not measured) GETs /metrics every S seconds, so the agent's cost of building the
series is in the figure. With `--kubelet`, a test kubelet (a separate process speaking the kubelet's
PodResources proto on a unix socket, not measured) allocates every GPU to a pod, and the agent asks it every
`--kubelet-refresh` seconds through grpclib and resolves the pods to their Deployment (an owner walk answered
in process: the agent's API reader is imported as in a cluster, no API server is asked).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from agent.runner import run_nodes, simulated_agents
from gpuevents.clock import SystemClock
from gpuevents.config import AgentConfig, Config, EmbeddedServerConfig, NatsConfig, SimulationConfig
from gpuevents.events import Event

TARGET_CPU_PCT = 1.0
TARGET_RSS_MB = 60.0


class NullBus:
    connected = False

    def __init__(self) -> None:
        self.events = 0

    def publish_event(self, event: Event) -> None:
        self.events += 1

    async def serve(self, *a: Any, **kw: Any) -> None:
        return None


SCRAPER = """
import sys, time, urllib.request
url, every = sys.argv[1], float(sys.argv[2])
while True:
    try:
        urllib.request.urlopen(url, timeout=5).read()
    except OSError:
        pass
    time.sleep(every)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_scraper(url: str, every_s: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", SCRAPER, url, str(every_s)])


def start_kubelet(socket_path: Path, uuids: list[str]) -> subprocess.Popen[bytes]:
    pods = [["team-a", f"llm-{i}", u] for i, u in enumerate(uuids)]
    p = subprocess.Popen([sys.executable, "-m", "tests.kube.podresources_server", str(socket_path), json.dumps(pods)],
                         cwd=str(Path(__file__).resolve().parent.parent), stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
    return p


def in_process_owners() -> Any:
    """An owner walk whose reads are answered here: every pod a Deployment's, through its ReplicaSet."""
    import agent.kubeapi  # noqa: F401  (the agent's API reader, imported as in a cluster: its memory counts)
    from agent.kubeowners import Meta, OwnerRef, OwnerWalker
    from gpuevents.config.kube import KubernetesJobsConfig

    async def fetch(api_version: str, kind: str, ns: str, name: str) -> Meta | None:
        if kind == "Pod":
            return Meta("v1", "Pod", ns, name, f"uid-{name}", owner=OwnerRef("apps/v1", "ReplicaSet", "llm-7d9", "rs"))
        if kind == "ReplicaSet":
            return Meta("apps/v1", kind, ns, name, "rs", owner=OwnerRef("apps/v1", "Deployment", "llm", "d"))
        return Meta("apps/v1", "Deployment", ns, "llm", "d") if kind == "Deployment" else None

    return OwnerWalker(fetch, KubernetesJobsConfig())


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(seconds: float, use_nats: bool, metrics: bool, scrape_s: float = 0.0,
                  scenario: str = "steady", kubelet_refresh: float | None = None) -> dict[str, Any]:
    server = None
    bus: Any
    port = free_port() if metrics else None
    agent_cfg = AgentConfig(node_name="bench-0", sample_interval=1, snapshot_interval=15,
                            metrics_port=port,
                            simulation=SimulationConfig(scenario=scenario, gpus_per_node=8))
    config = Config(agent=agent_cfg)
    if use_nats:
        from gpuevents.bus import Bus
        from gpuevents.server import EmbeddedServer

        tmp = tempfile.mkdtemp(prefix="gpuevents-bench-")
        server = EmbeddedServer(EmbeddedServerConfig(port=0, data_dir=Path(tmp) / "nats")).start()
        config = config.model_copy(update={"nats": NatsConfig(url=server.url)})
        bus = Bus(config.nats, name="bench-agent")
        await bus.connect()
        await bus.ensure_streams()
    else:
        bus = NullBus()
    clock = SystemClock()
    (agent,) = simulated_agents(config, nodes=1, gpus_per_node=8, scenario=scenario, start=clock.now())
    stop = asyncio.Event()
    kubelet = allocations = None
    if kubelet_refresh is not None:
        from agent.podresources.client import PodResources

        agent.tick(clock.now())  # the simulated GPUs' UUIDs, for the kubelet's pods
        sock = Path(tempfile.mkdtemp(prefix="kl")) / "kubelet.sock"
        kubelet = start_kubelet(sock, [r.uuid for r in agent.core.readings.values()])
        allocations = (PodResources(sock, ["nvidia.com/gpu"], refresh_s=kubelet_refresh), in_process_owners())
    task = asyncio.create_task(run_nodes([agent], bus, config=config, clock=clock, stop=stop,
                                         allocations=allocations))
    await asyncio.sleep(1.5)  # past start-up: imports, the first snapshot, the subscription
    scraper = None
    if metrics and scrape_s > 0:  # a separate process: its CPU is not the agent's
        scraper = start_scraper(f"http://127.0.0.1:{port}/metrics", scrape_s)
    cpu0, wall0 = cpu_seconds(), time.monotonic()
    await asyncio.sleep(seconds)
    cpu1, wall1 = cpu_seconds(), time.monotonic()
    if scraper is not None:
        scraper.terminate()
        scraper.wait()
    k8s_jobs = len([j for j in agent.core.jobs() if j.scheduler == "kubernetes"]) if kubelet_refresh else None
    allocated = sum(1 for i in agent.core.readings if agent.core.gpu_info(i, clock.now()).allocated)
    stop.set()
    counters = await task
    if kubelet is not None:
        kubelet.terminate()
        kubelet.wait()
    rss = psutil.Process().memory_info().rss / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if use_nats:
        await bus.flush(5)
        published = bus.stats.published
        await bus.close()
        assert server is not None
        server.stop()
    else:
        published = bus.events
    cpu_pct = 100.0 * (cpu1 - cpu0) / (wall1 - wall0)
    return {
        "cpu_pct": round(cpu_pct, 3), "rss_mb": round(rss, 1), "max_rss_mb": round(peak, 1),
        "seconds": round(wall1 - wall0, 1), "samples": counters.samples, "events_published": published,
        "gpus": 8, "devices": len(agent.core.readings), "processes": len(agent.core.held), "nats": use_nats,
        "metrics": metrics, "scrape_s": scrape_s, "scenario": scenario, "kubelet_refresh_s": kubelet_refresh,
        "gpus_allocated": allocated, "kubernetes_jobs": k8s_jobs,
        "targets": {"cpu_pct": TARGET_CPU_PCT, "rss_mb": TARGET_RSS_MB},
        "ok": cpu_pct <= TARGET_CPU_PCT and rss <= TARGET_RSS_MB,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--json", action="store_true", help="print the result as JSON on the last line")
    ap.add_argument("--no-nats", action="store_true", help="publish nowhere (no nats-server)")
    ap.add_argument("--metrics", action="store_true", help="serve /metrics too")
    ap.add_argument("--scrape", type=float, default=0.0, help="with --metrics: GET /metrics every this many s")
    ap.add_argument("--scenario", default="steady", help="simulation scenario (hopper-mig: GPM, MIG, pods, jobs)")
    ap.add_argument("--kubelet", action="store_true", help="GPU allocations from a test kubelet's PodResources API")
    ap.add_argument("--kubelet-refresh", type=float, default=10.0, help="with --kubelet: List this often (s)")
    args = ap.parse_args()
    result = asyncio.run(measure(args.seconds, not args.no_nats, args.metrics, args.scrape, args.scenario,
                                 args.kubelet_refresh if args.kubelet else None))
    served = f"scraped every {args.scrape:g}s" if args.metrics and args.scrape else (
        "served" if args.metrics else "off")
    print(f"agent overhead over {result['seconds']}s: {result['cpu_pct']}% of one core "
          f"(target <= {TARGET_CPU_PCT}), RSS {result['rss_mb']} MiB (target <= {TARGET_RSS_MB}), "
          f"peak {result['max_rss_mb']} MiB; {result['samples']} samples, "
          f"{result['processes']} processes on 8 GPUs ({result['devices']} devices, MIG instances included), "
          f"scenario {result['scenario']}, /metrics {served}"
          + (f", kubelet PodResources every {args.kubelet_refresh:g}s ({result['gpus_allocated']} GPUs allocated, "
             f"{result['kubernetes_jobs']} Kubernetes job)" if args.kubelet else ""), flush=True)
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
