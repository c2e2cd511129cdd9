"""Engine throughput and latency against a real nats-server, with the rule library.

    python benchmarks/engine_throughput.py [--json] [--nodes 2000] [--rounds 10] [--steady-seconds 10]

1. Publishes `nodes × rounds` node.snapshot events of a simulated fleet (8 GPUs, 16 processes a
   node, a mix of busy, idle-held and free GPUs) into GPUEVENTS.
2. Baseline: a bare nats-py pull consumer that only decodes them (orjson) and acks.
3. Engine: the real engine (rules/library + a no-`for` hot-GPU rule) consumes the same messages
   from its own durable; `snapshots_per_s` is its rate at saturation.
4. Latency: while a publisher holds a steady 1,000 snapshots/s of the same fleet, threshold events
   (`gpu.hot`) are published; each one's action request is seen on `gpuevents.act.>`; p50/p99 of
   dispatch time minus the event's time.
5. Changing readings: `--changing-rounds` more rounds of the fleet whose temperatures, power and
   busy utilisation move on every snapshot, as a real agent's do, with threshold crossings and
   processes starting and ending now and then; `changing_snapshots_per_s` is the engine's rate on
   them, from the first one published to the last one consumed, and `changing_ratio` its ratio to
   the bare consumer.

The last line with --json is one JSON object with the figures and where the engine's time went.
Publisher, engine and measuring all share this process, so the figures are conservative.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nats  # noqa: E402
import orjson  # noqa: E402
import psutil  # noqa: E402
from nats.js import api  # noqa: E402

import rules.engine.commit as commit  # noqa: E402
import rules.engine.service as service  # noqa: E402
import rules.intake.decoder as decoder  # noqa: E402
from gpuevents import subjects as S  # noqa: E402
from gpuevents.bus import Bus  # noqa: E402
from gpuevents.config import Config, EmbeddedServerConfig  # noqa: E402
from gpuevents.events import (  # noqa: E402
    GpuInfo,
    NodeInfo,
    NodeSnapshot,
    ProcessInfo,
    encode_event,
    make_event,
)
from gpuevents.records import ActionRequest  # noqa: E402
from gpuevents.server import EmbeddedServer  # noqa: E402
from rules.core.core import Core  # noqa: E402

LIBRARY = ROOT / "rules" / "library"
HOT_RULE = """\
rules:
  - name: bench-hot-now
    entity: gpu
    when: gpu.temp_c is not none and gpu.temp_c > 90
    actions: [{type: log, message: "hot {{ gpu.index }} on {{ node.name }}"}]
"""


def warning_channel(tmp: Path) -> dict[str, Any]:
    """`actions` with a Slack token in a file: the library's staged remedies load only where their warnings have a
    channel (DESIGN §3.4). The benchmarks run no action runner, so nothing is ever sent with it."""
    token = tmp / "slack-token"
    token.write_text("xoxb-benchmark-never-sent\n")
    return {"slack": {"token_file": str(token)}}


def node_snapshot(node: str, i: int, at: datetime, t0: datetime) -> NodeSnapshot:
    gpus, procs = [], []
    for g in range(8):
        kind = (i + g) % 4  # 0,1 busy; 2 held idle; 3 free
        pids = [10_000 + g * 2, 10_001 + g * 2] if kind != 3 else []
        util = 90.0 if kind < 2 else 0.0
        gpus.append(GpuInfo(node=node, index=g, uuid=f"GPU-{i:05d}-{g}", model="NVIDIA H100 80GB HBM3",
                            util_pct=util, mem_used_mib=40000 if pids else 0, mem_total_mib=81559,
                            mem_pct=49.0 if pids else 0.0, temp_c=60, power_w=300 if util else 80,
                            power_limit_w=700, fan_pct=None, ecc_uncorrected=0, idle=util < 5,
                            idle_since=t0 if util < 5 else None, pids=pids))
        for p in pids:
            procs.append(ProcessInfo(node=node, pid=p, name="python", cmdline="python train.py --config x.yaml",
                                     user=f"user{i % 50}", uid=1000 + i % 50, owner=f"user{i % 50}@example.com",
                                     create_time=t0 - timedelta(hours=5), ppid=1, gpus=[g], gpu_mem_mib=20000,
                                     gpu_util_pct=util / 2))
    return NodeSnapshot(node=NodeInfo(name=node, cluster="bench", labels={"env": "dev", "pool": "h100"},
                                      gpu_count=8, driver_version="550.54"), gpus=gpus, processes=procs)


def changing_snapshot(node: str, i: int, r: int, t0: datetime) -> NodeSnapshot:
    """The node of `node_snapshot` in round `r`, its readings moving as a real agent's do: temperature, power,
    a busy GPU's utilisation and its processes' share of it; now and then (one node in 20 per round) a busy GPU
    drops under the idle threshold, and (one in 25) a process ends and another starts in its place."""
    snap = node_snapshot(node, i, t0, t0)
    drop = (i + r) % 20 == 0
    gpus = []
    for g in snap.gpus:
        util = g.util_pct or 0.0  # node_snapshot gives every GPU a utilization
        update: dict[str, Any] = {"temp_c": 55.0 + (r + g.index) % 7, "power_w": (g.power_w or 0) + r % 5,
                                  "util_pct": util + (r % 3 if util > 50 else 0)}
        if drop and util > 50:  # a threshold crossing: idle from this round on
            update.update(util_pct=1.0, idle=True, idle_since=t0 + timedelta(seconds=15 * r))
            drop = False
        gpus.append(g.model_copy(update=update))
    procs = [p.model_copy(update={"gpu_util_pct": (p.gpu_util_pct or 0) + r % 3 if (p.gpu_util_pct or 0) > 0
                                  else p.gpu_util_pct}) for p in snap.processes]
    if procs and (i + r) % 25 == 0:  # one process ended, a new one started on its GPU
        old = procs[0]
        new_pid = 50_000 + r
        procs[0] = old.model_copy(update={"pid": new_pid, "create_time": t0 + timedelta(seconds=15 * r)})
        gpus = [g.model_copy(update={"pids": [new_pid if p == old.pid else p for p in g.pids]})
                if old.pid in g.pids else g for g in gpus]
    return snap.model_copy(update={"gpus": gpus, "processes": procs})


def snapshot_payloads(nodes: int, rounds: int, t0: datetime) -> list[tuple[str, bytes, str]]:
    out = []
    for r in range(rounds):
        at = t0 + timedelta(seconds=15 * r)
        for i in range(nodes):
            name = f"node-{i:05d}"
            e = make_event("node.snapshot", name, node_snapshot(name, i, at, t0), cluster="bench", time=at)
            out.append((S.event_subject("bench", name, e.type), encode_event(e), e.id))
    return out


async def publish_all(bus: Bus, payloads: list[tuple[str, bytes, str]]) -> None:
    for subject, data, msg_id in payloads:
        bus.publish_buffered(subject, data, msg_id)
    assert await bus.flush(300), "publishing did not finish"


async def baseline(url: str, total: int) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe(S.EVENTS_ALL, durable="baseline", stream=S.STREAM_EVENTS,
                                  config=api.ConsumerConfig(ack_policy=api.AckPolicy.EXPLICIT,
                                                            max_ack_pending=50_000))
    seen = 0
    start = time.perf_counter()
    while seen < total:
        try:
            msgs = await sub.fetch(512, timeout=2)
        except nats.errors.TimeoutError:
            break
        for m in msgs:
            orjson.loads(m.data)
            await m.ack()
        seen += len(msgs)
    elapsed = time.perf_counter() - start
    await nc.close()
    return seen / elapsed


class Timings:
    """Wall time spent in the engine's parts, by wrapping them (a few % of overhead)."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)

    def wrap(self, owner: Any, name: str, label: str) -> None:
        fn = getattr(owner, name)
        timings = self

        if asyncio.iscoroutinefunction(fn):
            async def awrapper(*a: Any, **k: Any) -> Any:
                t = time.perf_counter()
                try:
                    return await fn(*a, **k)
                finally:
                    timings.total[label] += time.perf_counter() - t
            setattr(owner, name, awrapper)
        else:
            def wrapper(*a: Any, **k: Any) -> Any:
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    timings.total[label] += time.perf_counter() - t
            setattr(owner, name, wrapper)


def events_consumed(engine: service.Engine) -> int:
    return int(sum(s.value for m in engine.metrics.events.collect() for s in m.samples
                   if s.name.endswith("_total")))


async def wait_until(cond: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark condition not reached")
        await asyncio.sleep(0.01)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="gpuevents-bench-"))
    rules_dir = tmp / "rules"
    rules_dir.mkdir()
    for f in LIBRARY.glob("*.yaml"):
        if not f.name.endswith(".test.yaml"):
            shutil.copy(f, rules_dir / f.name)
    (rules_dir / "bench-hot.yaml").write_text(HOT_RULE)
    server = EmbeddedServer(EmbeddedServerConfig(port=0, data_dir=tmp / "nats")).start()
    try:
        cfg = Config.model_validate({
            "cluster": "bench",
            "nats": {"url": server.url, "publish_buffer": 10_000_000},
            "engine": {"rules": [str(rules_dir)], "tick": "30s", "runners": 0,
                       "usage_db": str(tmp / "usage.sqlite")},
            "agent": {"snapshot_interval": "15s"}, "actions": warning_channel(tmp),
        })
        t0 = datetime.now(UTC) - timedelta(hours=1)
        payloads = snapshot_payloads(args.nodes, args.rounds, t0)
        total = len(payloads)
        bus = Bus(cfg.nats, name="bench")
        await bus.connect()
        await bus.ensure_streams()
        t = time.perf_counter()
        await publish_all(bus, payloads)
        publish_rate = total / (time.perf_counter() - t)
        size = statistics.mean(len(p[1]) for p in payloads[:100])
        del payloads

        base_rate = await baseline(server.url, total)

        timings = Timings()
        timings.wrap(decoder.RepeatDecoder, "decode", "decode")
        timings.wrap(Core, "_step", "core_step")  # what step and step_batch go through
        timings.wrap(commit.Committer, "commit", "commit_dispatch_persist")
        timings.wrap(service.Engine, "handle", "handle_batch")
        engine = await service.Engine.open(cfg, bus)
        stop = asyncio.Event()
        task = asyncio.create_task(engine.run(stop))
        await wait_until(lambda: engine.ready.is_set(), 30)
        start = time.perf_counter()
        await wait_until(lambda: events_consumed(engine) >= total, 600)
        elapsed = time.perf_counter() - start
        engine_rate = total / elapsed
        handle = timings.total["handle_batch"]
        breakdown = {k: round(v / total * 1e6, 1) for k, v in timings.total.items()}
        breakdown["fetch_ack_and_loop"] = round((elapsed - handle) / total * 1e6, 1)
        rss_mb = psutil.Process().memory_info().rss / 2**20

        latencies = await steady_latency(bus, args, cfg, t0)
        before = dict(timings.total)
        changing_rate, changing_total = await changing_throughput(bus, engine, args, t0)
        changing_breakdown = {k: round((v - before.get(k, 0.0)) / changing_total * 1e6, 1)
                              for k, v in timings.total.items()}
        stop.set()
        await task
        await bus.close()
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    lat = sorted(latencies)
    return {
        "snapshots": total,
        "snapshot_bytes": round(size),
        "publish_per_s": round(publish_rate),
        "snapshots_per_s": round(engine_rate),
        "baseline_snapshots_per_s": round(base_rate),
        "ratio": round(engine_rate / base_rate, 3),
        "rss_mb": round(rss_mb, 1),
        "p50_ms": round(lat[len(lat) // 2], 2) if lat else None,
        "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2) if lat else None,
        "latency_samples": len(lat),
        "changing_snapshots_per_s": round(changing_rate),
        "changing_ratio": round(changing_rate / base_rate, 3),
        "us_per_snapshot": breakdown,
        "us_per_changing_snapshot": changing_breakdown,
    }


async def steady_latency(bus: Bus, args: argparse.Namespace, cfg: Config, fleet_t0: datetime) -> list[float]:
    """p50/p99 from a threshold event's publication to its action's dispatch, at a steady 1,000 snapshots/s.

    The fleet is the one the saturation run loaded (same processes, same idle times), so the load is steady:
    built from a new `t0`, every process would look restarted and every GPU newly idle, and the first two
    seconds would be a fleet-wide restart (every incident resolved as gone and opened again)."""
    latencies: list[float] = []
    expected = [10**9]
    all_seen = asyncio.Event()

    async def on_request(msg: Any) -> None:
        req = ActionRequest.model_validate_json(msg.data)
        if req.rule == "bench-hot-now" and req.event_time is not None:
            latencies.append((datetime.now(UTC) - req.event_time).total_seconds() * 1000)
            if len(latencies) >= expected[0]:
                all_seen.set()

    await bus.subscribe(S.ACTIONS_ALL, on_request)
    t0 = datetime.now(UTC)
    names = [f"node-{i:05d}" for i in range(args.nodes)]
    templates = {n: node_snapshot(n, i, t0, fleet_t0) for i, n in enumerate(names)}
    # The publisher's 2,000 template snapshots live in the engine's process only because this benchmark
    # shares it: keep them out of the engine's garbage collections, as a separate publisher would.
    gc.freeze()
    rate, hot_every = 1000, 0.05
    start = time.perf_counter()
    sent = hot = 0
    while (elapsed := time.perf_counter() - start) < args.steady_seconds:
        due = int(elapsed * rate)
        while sent < due:
            n = names[sent % len(names)]
            bus.publish_event(make_event("node.snapshot", n, templates[n], cluster="bench",
                                         time=datetime.now(UTC)))
            sent += 1
        if elapsed >= hot * hot_every:
            n = names[hot % len(names)]
            g = templates[n].gpus[(hot // len(names)) % 8].model_copy(update={"temp_c": 95.0 + hot % 3})
            bus.publish_event(make_event("gpu.hot", n, g, cluster="bench", time=datetime.now(UTC)))
            hot += 1
        await asyncio.sleep(0.005)  # pacing the publisher, not waiting for a result
    await bus.flush(30)
    expected[0] = hot
    if len(latencies) < hot:
        try:
            await asyncio.wait_for(all_seen.wait(), 30)
        except TimeoutError:
            pass
    return latencies


async def changing_throughput(bus: Bus, engine: service.Engine, args: argparse.Namespace,
                              fleet_t0: datetime) -> tuple[float, int]:
    """The engine's rate on `--changing-rounds` rounds of the same fleet whose readings change on every
    snapshot (`changing_snapshot`): each one rebuilds its node's views, evaluates their rules again and is
    decoded in full. Not a target; the figure a real fleet sees."""
    before = events_consumed(engine)
    now = datetime.now(UTC)
    payloads = []
    for r in range(args.changing_rounds):
        for i in range(args.nodes):
            name = f"node-{i:05d}"
            e = make_event("node.snapshot", name, changing_snapshot(name, i, r, fleet_t0), cluster="bench",
                           time=now + timedelta(milliseconds=r * 100 + 1))
            payloads.append((S.event_subject("bench", name, e.type), encode_event(e), e.id))
    total = len(payloads)
    start = time.perf_counter()  # the engine consumes while they are published (this process does both)
    await publish_all(bus, payloads)
    await wait_until(lambda: events_consumed(engine) >= before + total, 600)
    return total / (time.perf_counter() - start), total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steady-seconds", type=float, default=10)
    ap.add_argument("--changing-rounds", type=int, default=2)
    args = ap.parse_args()
    result = asyncio.run(run(args))
    if not args.json:
        for k, v in result.items():
            print(f"{k:28} {v}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
