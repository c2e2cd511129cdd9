"""gpuevents against the tool a user would pick instead: Prometheus with an alert rule, on the same fleet.

    python benchmarks/vs_prometheus.py [--json] [--nodes 200] [--interval 2] [--seconds 60] [--for 10]

1. A simulated fleet of `--nodes` nodes × 8 GPUs, as the agent's pure core (agent/core.py) sees it, updated every
   `--interval` seconds: its dcgm-exporter metrics are served from one endpoint with every node's series (the
   agent's own collector), and its node snapshots are published to NATS, as agents do.
2. Debian's `prometheus` scrapes that endpoint every `--interval` and evaluates the equivalent alert rule every
   `--interval`: `DCGM_FI_DEV_GPU_UTIL < 5` held `for: --for`.
3. The engine (`gpuevents engine`, its own process, no action runner) runs the equivalent rule: `gpu.idle` held
   `for: --for`, with a `log` action.
4. After a warm-up, one busy GPU goes idle. Reported: CPU seconds per node update of each process (Prometheus per
   scraped node, the engine per consumed snapshot) over the steady phase, and the time from the GPU going idle
   to Prometheus's alert firing and to the engine's action request.

Both run on this machine at once; the publisher and the metrics endpoint run in this process, measured apart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import psutil  # noqa: E402
import yaml  # noqa: E402

from agent.core import NodeCore  # noqa: E402
from agent.metrics import AgentCollector, AgentCounters, MetricsServer  # noqa: E402
from agent.sample import GpuReading, NodeReading  # noqa: E402
from gpuevents import subjects as S  # noqa: E402
from gpuevents.bus import Bus  # noqa: E402
from gpuevents.config import Config, EmbeddedServerConfig, ThresholdsConfig  # noqa: E402
from gpuevents.server import EmbeddedServer, free_port  # noqa: E402

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
GPUS = 8


def reading(node: int, idle_gpu: bool) -> NodeReading:
    gpus = []
    for g in range(GPUS):
        util = 0.0 if (idle_gpu and node == 0 and g == 0) else 90.0
        gpus.append(GpuReading(index=g, uuid=f"GPU-{node:04d}-{g}", model="NVIDIA H100 80GB HBM3", util_pct=util,
                               mem_used_mib=40000, mem_total_mib=81559, temp_c=60, power_w=300 if util else 80,
                               power_limit_w=700, sm_clock_mhz=1980 if util else 345, energy_mj=0))
    return NodeReading(gpus=tuple(gpus))


def _promdur(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def start_prometheus(tmp: Path, target: str, interval: float, for_s: float) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    (tmp / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "gpu", "interval": _promdur(interval),
                                                              "rules": [{"alert": "GpuIdle",
                                                                         "expr": "DCGM_FI_DEV_GPU_UTIL < 5",
                                                                         "for": _promdur(for_s)}]}]}))
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": _promdur(interval), "evaluation_interval": _promdur(interval)},
        "rule_files": [str(tmp / "rules.yml")],
        "scrape_configs": [{"job_name": "gpuevents", "static_configs": [{"targets": [target]}]}],
    }))
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=(tmp / "prometheus.log").open("wb"))
    return proc, port


def start_engine(tmp: Path, url: str, for_s: float, interval: float) -> subprocess.Popen[bytes]:
    rules = tmp / "rules"
    rules.mkdir()
    (rules / "idle.yaml").write_text(yaml.safe_dump({"rules": [{
        "name": "gpu-idle", "entity": "gpu", "when": "gpu.idle", "for": f"{for_s}s",
        "actions": [{"type": "log", "message": "idle {{ entity.id }}"}]}]}))
    (tmp / "engine.yaml").write_text(yaml.safe_dump({
        "cluster": "bench", "nats": {"url": url},
        "engine": {"rules": [str(rules)], "runners": 0, "tick": f"{max(interval, 1)}s",
                   "usage_db": str(tmp / "usage.sqlite")},
        "agent": {"snapshot_interval": f"{interval}s"}}))
    return subprocess.Popen([sys.executable, "-m", "gpuevents.cli", "engine", "-c", str(tmp / "engine.yaml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(ROOT))


async def alert_firing(session: aiohttp.ClientSession, port: int) -> bool:
    try:
        async with session.get(f"http://127.0.0.1:{port}/api/v1/alerts") as r:
            data = await r.json()
    except (aiohttp.ClientError, ValueError):
        return False
    return any(a.get("state") == "firing" for a in data.get("data", {}).get("alerts", []))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="gpuevents-vs-prom-"))
    nats = EmbeddedServer(EmbeddedServerConfig(port=0, data_dir=tmp / "nats")).start()
    cores = [NodeCore(node=f"node-{i:04d}", cluster="bench", thresholds=ThresholdsConfig(),
                      snapshot_interval_s=args.interval) for i in range(args.nodes)]
    metrics = MetricsServer(AgentCollector(lambda: cores, AgentCounters()), 0, addr="127.0.0.1").start()
    prom, prom_port = start_prometheus(tmp, f"127.0.0.1:{metrics.port}", args.interval, args.for_s)
    cfg = Config.model_validate({"cluster": "bench", "nats": {"url": nats.url, "publish_buffer": 10_000_000}})
    bus = Bus(cfg.nats, name="vs-prometheus")
    await bus.connect()
    await bus.ensure_streams()
    engine = start_engine(tmp, nats.url, args.for_s, args.interval)
    action_at: list[float] = []

    async def on_request(msg: Any) -> None:
        if not action_at:
            action_at.append(time.monotonic())

    await bus.subscribe(S.ACTIONS_ALL, on_request)
    try:
        async with aiohttp.ClientSession() as session:
            idle_at: float | None = None
            alert_at: float | None = None
            updates = 0
            start = time.monotonic()
            cpu0: tuple[float, float] | None = None
            warmup = args.seconds / 3
            while True:
                now = time.monotonic()
                elapsed = now - start
                if cpu0 is None and elapsed >= warmup:
                    cpu0 = (_cpu(prom), _cpu(engine))
                    measured_from, updates = now, 0
                idle = idle_at is not None or elapsed >= args.seconds / 2
                if idle and idle_at is None:
                    idle_at = now
                stamp = datetime.now(UTC)
                for i, core in enumerate(cores):
                    for e in core.step(stamp, reading(i, idle), {}):
                        bus.publish_event(e)
                updates += len(cores)
                if idle_at is not None and alert_at is None and await alert_firing(session, prom_port):
                    alert_at = time.monotonic()
                if elapsed >= args.seconds and ((alert_at is not None and action_at) or elapsed >= 3 * args.seconds):
                    break
                await asyncio.sleep(max(0.0, args.interval - (time.monotonic() - now)))
            window = time.monotonic() - measured_from
            assert cpu0 is not None
            prom_cpu, engine_cpu = _cpu(prom) - cpu0[0], _cpu(engine) - cpu0[1]
    finally:
        await bus.close(flush_timeout=1)
        for p in (engine, prom):
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        metrics.stop()
        nats.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    node_updates = updates  # each node, each interval: one scrape of its series, one snapshot consumed
    return {
        "nodes": args.nodes, "gpus": args.nodes * GPUS, "interval_s": args.interval, "for_s": args.for_s,
        "measured_s": round(window, 1), "node_updates": node_updates,
        "prometheus_cpu_us_per_node_update": round(prom_cpu / node_updates * 1e6, 1),
        "engine_cpu_us_per_node_update": round(engine_cpu / node_updates * 1e6, 1),
        "idle_to_prometheus_alert_s": round(alert_at - idle_at, 1) if alert_at and idle_at else None,
        "idle_to_engine_action_s": round(action_at[0] - idle_at, 1) if action_at and idle_at else None,
    }


def _cpu(proc: subprocess.Popen[bytes]) -> float:
    try:
        t = psutil.Process(proc.pid).cpu_times()
        return float(t.user + t.system + t.children_user + t.children_system)
    except psutil.Error:
        return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--for", dest="for_s", type=float, default=10.0)
    args = ap.parse_args()
    result = asyncio.run(run(args))
    if not args.json:
        for k, v in result.items():
            print(f"{k:36} {v}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
