"""Engine scale-out on a real three-server NATS cluster: 1 and 2 replicas, and partitions moving on a crash.

    python benchmarks/engine_scaleout.py [--json] [--nodes 1000] [--rounds 6] [--partitions 4]

1. Starts three nats-server processes as one JetStream cluster on loopback (R3 streams and KV), the same
   fixture the cluster tests use.
2. For 1 and then 2 replicas, each a separate `gpuevents engine` process (the rule library, no action runner,
   `engine.partitions` partitions, 2 s leases) on a fresh cluster: once every partition is held, publishes
   `nodes × rounds` snapshots whose readings move as a real agent's do (benchmarks/engine_throughput.py's
   changing fleet) and times them from the first publish until every partition's consumer has nothing
   pending or unacknowledged: `snapshots_per_s` per replica count, and the ratio of 2 to 1.
3. With 2 replicas holding their partitions, SIGKILLs one: `partitions_moved_s` is the time until the
   survivor holds every partition (the lease TTL bounds it: at most two lease periods).

The publisher runs in this process; the engines in their own, so two replicas use two cores where there are.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
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

import nats  # noqa: E402
import yaml  # noqa: E402
from engine_throughput import LIBRARY, changing_snapshot, warning_channel  # noqa: E402

from gpuevents import subjects as S  # noqa: E402
from gpuevents.bus import Bus  # noqa: E402
from gpuevents.config import Config  # noqa: E402
from gpuevents.events import encode_event, make_event  # noqa: E402
from tests.nats_cluster import NatsCluster  # noqa: E402

LEASE_TTL_S = 2.0


def write_config(tmp: Path, urls: list[str], partitions: int) -> Path:
    rules = tmp / "rules"
    rules.mkdir(exist_ok=True)
    for f in LIBRARY.glob("*.yaml"):
        if not f.name.endswith(".test.yaml"):
            shutil.copy(f, rules / f.name)
    cfg = {
        "cluster": "bench",
        "nats": {"url": urls, "reconnect_wait": 0.2, "publish_buffer": 10_000_000, "streams": {"replicas": 3}},
        "engine": {"rules": [str(rules)], "partitions": partitions, "lease_ttl": f"{LEASE_TTL_S}s", "runners": 0,
                   "tick": "30s", "usage_db": str(tmp / "usage.sqlite")},
        "agent": {"snapshot_interval": "15s"}, "actions": warning_channel(tmp),
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start_engine(config: Path, name: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = log.open("wb")
    return subprocess.Popen([sys.executable, "-m", "gpuevents.cli", "engine", "-c", str(config)], stdout=out,
                            stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))


async def lease_holders(js: Any, partitions: int) -> dict[int, str]:
    """Partition → the holder of its unexpired lease."""
    kv = await js.key_value("gpuevents-state")
    now = datetime.now(UTC)
    out = {}
    for p in range(partitions):
        try:
            entry = await kv.get(f"lease.engine.p{p}")
        except nats.js.errors.KeyNotFoundError:
            continue
        rec = json.loads(entry.value or b"{}")
        if rec.get("holder") and datetime.fromisoformat(rec["expires_at"]) > now:
            out[p] = rec["holder"]
    return out


async def pending(js: Any, partitions: int) -> int | None:
    """Messages every partition's consumer has yet to deliver or see acknowledged; None until all exist."""
    total = 0
    for p in range(partitions):
        try:
            info = await js.consumer_info(S.STREAM_EVENTS, f"gpuevents-engine-p{p}")
        except nats.js.errors.NotFoundError:
            return None
        total += info.num_pending + info.num_ack_pending
    return total


async def until(cond: Any, timeout: float, what: str, every: float = 0.05) -> float:
    start = time.monotonic()
    while True:
        if await cond():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"benchmark: no {what} within {timeout:.0f}s")
        await asyncio.sleep(every)


def payloads(nodes: int, rounds: int) -> list[tuple[str, bytes, str]]:
    t0 = datetime.now(UTC) - timedelta(hours=1)
    now = datetime.now(UTC)
    out = []
    for r in range(rounds):
        for i in range(nodes):
            name = f"node-{i:05d}"
            e = make_event("node.snapshot", name, changing_snapshot(name, i, r, t0), cluster="bench",
                           time=now + timedelta(milliseconds=r * 100 + 1))
            out.append((S.event_subject("bench", name, e.type), encode_event(e), e.id))
    return out


async def phase(replicas: int, args: argparse.Namespace, data: list[tuple[str, bytes, str]],
                kill_one: bool) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="gpuevents-scaleout-"))
    cluster = await asyncio.to_thread(NatsCluster(tmp / "cluster").start)
    engines: list[subprocess.Popen[bytes]] = []
    try:
        config_path = write_config(tmp, cluster.urls, args.partitions)
        cfg = Config.model_validate(yaml.safe_load(config_path.read_text()))
        bus = Bus(cfg.nats, name="scaleout-publisher")
        await bus.connect()
        await bus.ensure_streams(args.partitions)
        nc = await nats.connect(servers=cluster.urls)
        js = nc.jetstream()
        engines = [start_engine(config_path, f"r{i}", tmp / f"engine-{i}.log") for i in range(replicas)]

        async def all_held() -> bool:
            held = await lease_holders(js, args.partitions)
            if os.environ.get("DEBUG"):
                print(held, await pending(js, args.partitions), file=sys.stderr)
            fair = len(held) == args.partitions and len(set(held.values())) == replicas
            return fair and await pending(js, args.partitions) == 0

        await until(all_held, 60, "partitions held by every replica")
        start = time.perf_counter()
        for subject, payload, msg_id in data:
            bus.publish_buffered(subject, payload, msg_id)
        assert await bus.flush(300), "publishing did not finish"

        async def drained() -> bool:
            return await pending(js, args.partitions) == 0

        await until(drained, 900, "drained partitions", every=0.1)
        elapsed = time.perf_counter() - start
        out: dict[str, Any] = {"replicas": replicas, "snapshots": len(data),
                               "snapshots_per_s": round(len(data) / elapsed)}
        if kill_one:
            victim = engines[0]
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            killed = time.monotonic()

            async def survivor_holds_all() -> bool:
                held = await lease_holders(js, args.partitions)
                return len(held) == args.partitions and len(set(held.values())) == 1

            await until(survivor_holds_all, 60, "partitions moved to the survivor")
            out["partitions_moved_s"] = round(time.monotonic() - killed, 2)
            out["lease_ttl_s"] = LEASE_TTL_S
        await nc.close()
        await bus.close(flush_timeout=1)
        return out
    finally:
        for e in engines:
            if e.poll() is None:
                e.send_signal(signal.SIGTERM)
                try:
                    e.wait(30)
                except subprocess.TimeoutExpired:
                    e.kill()
        cluster.stop()
        if os.environ.get("KEEP"):
            print("kept", tmp, file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    data = payloads(args.nodes, args.rounds)
    one = await phase(1, args, data, kill_one=False)
    two = await phase(2, args, data, kill_one=True)
    return {
        "nodes": args.nodes, "partitions": args.partitions, "snapshots": len(data), "cores": os.cpu_count(),
        "one_replica_snapshots_per_s": one["snapshots_per_s"],
        "two_replicas_snapshots_per_s": two["snapshots_per_s"],
        "ratio_two_to_one": round(two["snapshots_per_s"] / one["snapshots_per_s"], 2),
        "partitions_moved_s": two["partitions_moved_s"], "lease_ttl_s": two["lease_ttl_s"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--partitions", type=int, default=4)
    args = ap.parse_args()
    result = asyncio.run(run(args))
    if not args.json:
        for k, v in result.items():
            print(f"{k:30} {v}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
