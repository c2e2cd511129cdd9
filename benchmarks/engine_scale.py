"""The engine at fleet scale: memory, tick, and what reading the fleet costs the engine consuming it.

    python benchmarks/engine_scale.py [--sizes 1000,5000,20000] [--events 1500] [--json]

For each size (nodes × 8 GPUs × 16 processes, the fleet of engine_throughput.py, with the rule library), in a fresh
child process so that its memory is its own:
1. RSS before and after the core takes in every node (stepped in directly: no NATS), as KB per GPU; the ingest
   time per GPU; then the RSS the read model adds.
2. Tick: a steady full tick (every time-dependent rule over every entity, as the engine's sweep does in slices).
3. Consumption: an engine (rules/engine/service.py, its core filled as above) consumes changing snapshots (readings
   moving, a threshold crossed now and then) one at a time on the event loop, as its batches do; the CPU per
   changing snapshot (the core's step), and the longest gap between two snapshots with nobody reading.
   A gap is counted in this thread's CPU time (the event loop working for others: the machine's other processes
   do not count) and in wall time.
4. Status: `gpuevents status` is asked 10 times, one after another, while it consumes (each answer waits for a
   read model that saw the snapshots consumed before the question): the median and worst latency, and the
   longest gap between two snapshots meanwhile (the stall reading causes); the summary reply's size.
Ratios: each figure to the smallest size's (the baseline, same run); the stall also to the gap with nobody
reading. Every size's figures come from the same code, on a shared machine: read ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import psutil  # noqa: E402
from engine_throughput import HOT_RULE, LIBRARY, changing_snapshot, node_snapshot, warning_channel  # noqa: E402

from gpuevents.bus import Bus  # noqa: E402
from gpuevents.config import Config, EmbeddedServerConfig  # noqa: E402
from gpuevents.events import Event, make_event  # noqa: E402
from gpuevents.server import EmbeddedServer  # noqa: E402
from rules.core.core import Tick  # noqa: E402
from rules.engine.gcpolicy import GcPolicy  # noqa: E402
from rules.engine.read.status import answer  # noqa: E402
from rules.engine.servers import PagedModels  # noqa: E402
from rules.engine.service import Engine  # noqa: E402

GPUS = 8
ASKS = 10
MAX_PAYLOAD = 1024 * 1024  # nats-server's default


def rss_mb() -> float:
    return float(psutil.Process().memory_info().rss) / 2**20


def event(i: int, r: int, t0: datetime) -> Event:
    name = f"node-{i:05d}"
    at = t0 + timedelta(seconds=15 * r)
    snap = node_snapshot(name, i, at, t0) if r == 0 else changing_snapshot(name, i, r, t0)
    return make_event("node.snapshot", name, snap, cluster="bench", time=at)


class Consumer:
    """Steps changing snapshots into the engine's core one at a time, yielding between them as the engine's
    batches do between fetches; records the gaps between two snapshots (the time others held the loop)."""

    def __init__(self, engine: Engine, nodes: int, t0: datetime, policy: GcPolicy) -> None:
        self.engine, self.nodes, self.t0, self.policy = engine, nodes, t0, policy
        self.k = 0
        self.gaps: list[float] = []  # wall time between two snapshots: others' work, and the OS's preemption
        self.cpu_gaps: list[float] = []  # this thread's CPU time between two snapshots: others' work on the loop

    def next_event(self) -> Event:
        pool = min(self.nodes, 500)  # these nodes change round after round
        i, r = self.k % pool, 1 + self.k // pool
        self.k += 1
        return event(i, r, self.t0)

    async def run(self, stop: asyncio.Event, count: int | None = None) -> int:
        core = self.engine.core
        done = 0
        ev = self.next_event()
        last, last_cpu = time.perf_counter(), time.thread_time()
        while not stop.is_set() and (count is None or done < count):
            start, start_cpu = time.perf_counter(), time.thread_time()
            self.gaps.append(start - last)
            self.cpu_gaps.append(start_cpu - last_cpu)
            core.step(ev, ev.time)
            self.engine.hold.changed()
            done += 1
            self.policy.tick(self.nodes * 25)  # as the engine does after each batch
            ev = self.next_event()  # made here, so that making it counts as the consumer's own time
            last, last_cpu = time.perf_counter(), time.thread_time()
            await asyncio.sleep(0)
        return done


async def measure(nodes: int, events: int, tmp: Path) -> dict[str, Any]:
    """One size, against an embedded nats-server the engine opens its stores on (the benchmark steps the core
    directly: nothing is published or consumed)."""
    server = EmbeddedServer(EmbeddedServerConfig(port=0, data_dir=tmp / "nats")).start()
    bus: Bus | None = None
    try:
        cfg = config(tmp, server.url)
        bus = Bus(cfg.nats, name="bench")
        await bus.connect()
        return await measure_engine(await Engine.open(cfg, bus), nodes, events)
    finally:
        if bus is not None:
            await bus.close()
        server.stop()


def config(tmp: Path, url: str) -> Config:
    rules_dir = tmp / "rules"
    rules_dir.mkdir(exist_ok=True)
    for f in LIBRARY.glob("*.yaml"):
        if not f.name.endswith(".test.yaml"):
            shutil.copy(f, rules_dir / f.name)
    (rules_dir / "bench-hot.yaml").write_text(HOT_RULE)
    return Config.model_validate({
        "cluster": "bench", "nats": {"url": url},
        "engine": {"rules": [str(rules_dir)], "tick": "30s", "offline_grace": "1h",
                   "usage_db": str(tmp / "usage.sqlite")},
        "agent": {"snapshot_interval": "15s"}, "actions": warning_channel(tmp),
    })


async def measure_engine(engine: Engine, nodes: int, events: int) -> dict[str, Any]:
    t0 = datetime.now(UTC) - timedelta(hours=1)
    policy = GcPolicy()
    policy.start()
    gc.collect()
    before = rss_mb()
    t = time.perf_counter()
    for i in range(nodes):
        ev = event(i, 0, t0)
        engine.core.step(ev, ev.time)
        if i % 1000 == 999:
            policy.tick(i)
    ingest_s = time.perf_counter() - t
    gc.collect()
    gc.freeze()
    core_mb = rss_mb() - before
    ticks = []
    for n in range(3):
        t = time.perf_counter()
        engine.core.step(Tick(), t0 + timedelta(seconds=30 * (n + 1)))
        ticks.append(time.perf_counter() - t)
    engine.hold.changed()
    t = time.perf_counter()
    model = await engine.answers.read_model()
    first_build_s = time.perf_counter() - t
    model_mb = rss_mb() - before - core_mb

    consumer = Consumer(engine, nodes, t0, policy)
    await consumer.run(asyncio.Event(), 50)  # warm up
    consumer.gaps.clear()
    consumer.cpu_gaps.clear()
    cpu = time.process_time()
    await consumer.run(asyncio.Event(), events)
    cpu_us = (time.process_time() - cpu) / events * 1e6
    quiet_gap, quiet_cpu_gap = max(consumer.gaps), max(consumer.cpu_gaps)

    consumer.gaps.clear()
    consumer.cpu_gaps.clear()
    stop = asyncio.Event()
    consuming = asyncio.create_task(consumer.run(stop))
    paged = PagedModels(engine.answers)
    latencies, size = [], 0
    for _ in range(ASKS):
        t = time.perf_counter()
        reply = await answer(paged, b"{}", None, 1, MAX_PAYLOAD)
        latencies.append(time.perf_counter() - t)
        size = len(reply)
    stop.set()
    consumed = await consuming
    stall, cpu_stall = max(consumer.gaps), max(consumer.cpu_gaps)
    del model
    return {
        "nodes": nodes, "gpus": nodes * GPUS,
        "rss_core_mb": round(core_mb, 1), "kb_per_gpu": round(core_mb * 1024 / (nodes * GPUS), 2),
        "read_model_mb": round(model_mb, 1), "read_model_kb_per_gpu": round(model_mb * 1024 / (nodes * GPUS), 2),
        "ingest_us_per_gpu": round(ingest_s / (nodes * GPUS) * 1e6, 1),
        "open_incidents": len(engine.core.open_incidents()),
        "tick_s": round(statistics.median(ticks[1:]), 4),
        "read_model_build_s": round(first_build_s, 3),
        "status_latency_s": round(statistics.median(latencies), 3), "status_latency_max_s": round(max(latencies), 3),
        "status_reply_bytes": size,
        "stall_ms": round(stall * 1e3, 2), "quiet_gap_ms": round(quiet_gap * 1e3, 2),
        "stall_cpu_ms": round(cpu_stall * 1e3, 2), "quiet_gap_cpu_ms": round(quiet_cpu_gap * 1e3, 2),
        "consumed_during_status": consumed,
        "cpu_us_per_changing_snapshot": round(cpu_us, 1),
    }


FIGURES = (("kb_per_gpu", "RSS of the core, KB per GPU"),
           ("read_model_kb_per_gpu", "RSS of the read model, KB per GPU"),
           ("ingest_us_per_gpu", "ingest, µs per GPU"),
           ("tick_s", "steady full tick, s"),
           ("read_model_build_s", "read model build, s"),
           ("status_latency_s", "status latency (median of 10), s"),
           ("status_latency_max_s", "status latency (worst of 10), s"),
           ("stall_cpu_ms", "longest stall while asked (loop CPU), ms"),
           ("quiet_gap_cpu_ms", "longest gap, nobody reading (loop CPU), ms"),
           ("stall_ms", "longest stall while asked (wall), ms"),
           ("quiet_gap_ms", "longest gap, nobody reading (wall), ms"),
           ("consumed_during_status", "snapshots consumed during the 10 asks"),
           ("cpu_us_per_changing_snapshot", "core CPU per changing snapshot, µs"),
           ("status_reply_bytes", "status reply, bytes"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,5000,20000", help="node counts, comma-separated")
    ap.add_argument("--events", type=int, default=1500, help="changing snapshots for the CPU figure")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: measure this size, print JSON
    args = ap.parse_args()
    if args.one is not None:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(asyncio.run(measure(args.one, args.events, Path(tmp)))))
        return 0
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        child = subprocess.run([sys.executable, __file__, "--one", str(n), "--events", str(args.events)],
                               capture_output=True, text=True, check=False)
        if child.returncode != 0:
            print(child.stderr, file=sys.stderr)
            return child.returncode
        rows.append(json.loads(child.stdout.strip().splitlines()[-1]))
        print(f"measured {n} nodes", file=sys.stderr)
    base = rows[0]
    for row in rows:
        row["stall_ratio_to_quiet"] = (round(row["stall_cpu_ms"] / row["quiet_gap_cpu_ms"], 2)
                                       if row["quiet_gap_cpu_ms"] else None)
        row["ratios_to_baseline"] = {k: round(row[k] / base[k], 2) for k, _ in FIGURES if base.get(k)}
    header = f"{'':44}" + "".join(f"{r['nodes']:>12,}" for r in rows)
    print(f"engine at scale: nodes × {GPUS} GPUs, baseline {base['nodes']:,} nodes (ratios in brackets)")
    print(header)
    for key, text in FIGURES:
        cells = "".join(f"{r[key]:>12,}" if r is base else f"{r[key]:>7,} ({r['ratios_to_baseline'].get(key, 0):g}×)"
                        .rjust(12) for r in rows)
        print(f"{text:44}{cells}")
    if args.json:
        print(json.dumps({"sizes": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
