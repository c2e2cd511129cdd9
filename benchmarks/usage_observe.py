"""Benchmark of `UsageRecorder.observe` per changing snapshot: the usage aggregator that keeps a node's plan across
readings (rules/usage/rollup.py) against the one that planned every snapshot again and the fits
aggregator likewise (tests/rules/usage/reference_rollup.py, reference_fits.py), same snapshots, same run; the job
ledger runs beside both.

    python benchmarks/usage_observe.py [--json] [--snapshots 5000]

Each snapshot is one node of 8 GPUs and 16 processes (two a GPU, two owners, a team label on half) whose readings
(utilisation, power, memory, temperature) change every time and whose owners, pids and idle state do not: what a
busy fleet sends. Prints the median µs per snapshot of the recorder with each aggregator, of each aggregator
alone, and the ratios (old / new).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuevents.config import CostsConfig  # noqa: E402
from gpuevents.costs import CostModel  # noqa: E402
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, SnapshotEvent  # noqa: E402
from rules.usage.fits import FitAggregator  # noqa: E402
from rules.usage.recorder import UsageRecorder  # noqa: E402
from rules.usage.rollup import TeamResolver, UsageAggregator  # noqa: E402
from rules.usage.store import UsageStore  # noqa: E402
from tests.rules.usage import reference_fits  # noqa: E402
from tests.rules.usage import reference_rollup as ref  # noqa: E402

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def snapshots(n: int) -> list[SnapshotEvent]:
    out = []
    for i in range(n):
        at = T0 + timedelta(seconds=15 * i)
        gpus = [GpuInfo(node="n1", index=g, uuid=f"GPU-{g}", model="NVIDIA H100 80GB HBM3", util_pct=(i + g) % 100,
                        mem_used_mib=20000 + i % 500, mem_total_mib=81559, temp_c=40 + i % 30,
                        power_w=300 + (i * 7 + g) % 300, sm_active_pct=(i * 3 + g) % 100, pids=[100 + 2 * g,
                        101 + 2 * g]) for g in range(8)]
        procs = [ProcessInfo(node="n1", pid=100 + p, name="python", user="alice" if p % 4 < 2 else "bob",
                             create_time=T0, labels={"team": "ml"} if p < 8 else {}) for p in range(16)]
        out.append(SnapshotEvent(source="node/n1", cluster="c1", time=at,
                                 data=NodeSnapshot(node=NodeInfo(name="n1", cluster="c1"), gpus=gpus,
                                                   processes=procs)))
    return out


def per_snapshot_us(make: Callable[[], Any], snaps: list[SnapshotEvent], rounds: int = 5) -> float:
    samples = []
    for _ in range(rounds):
        target = make()
        gc.collect()
        t = time.perf_counter_ns()
        for s in snaps:
            target.observe(s, s.time)
        samples.append((time.perf_counter_ns() - t) / len(snaps) / 1000)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--snapshots", type=int, default=5000)
    args = ap.parse_args()
    snaps = snapshots(args.snapshots)
    teams = TeamResolver(team_label="team")
    costs = CostModel(CostsConfig())

    def rated(model: str | None) -> float:
        return costs.gpu_cost(model).rated_power_w

    def new_agg() -> UsageAggregator:
        return UsageAggregator(snapshot_interval=15, teams=teams, rated_power_w=rated)

    def old_agg() -> Any:
        return ref.UsageAggregator(snapshot_interval=15, teams=ref.TeamResolver(team_label="team"),
                                   rated_power_w=rated)

    with tempfile.TemporaryDirectory() as tmp:
        store = UsageStore(Path(tmp) / "usage.db")

        def recorder(agg: Callable[[], Any], fits: Callable[..., Any]) -> Callable[[], UsageRecorder]:
            return lambda: UsageRecorder(agg(), store, 86400.0, costs, fits(snapshot_interval=15, teams=teams))

        out = {
            "recorder_old_us": per_snapshot_us(recorder(old_agg, reference_fits.FitAggregator), snaps),
            "recorder_new_us": per_snapshot_us(recorder(new_agg, FitAggregator), snaps),
            "aggregator_old_us": per_snapshot_us(old_agg, snaps),
            "aggregator_new_us": per_snapshot_us(new_agg, snaps),
        }
        store.close()
    out = {k: round(v, 2) for k, v in out.items()}
    out["recorder_old_to_new"] = round(out["recorder_old_us"] / out["recorder_new_us"], 2)
    out["aggregator_old_to_new"] = round(out["aggregator_old_us"] / out["aggregator_new_us"], 2)
    if args.json:
        print(json.dumps(out))
        return
    print(f"UsageRecorder.observe per changing snapshot (8 GPUs, 16 processes), {args.snapshots} snapshots:")
    print(f"  recorder   old {out['recorder_old_us']:8.2f} µs   new {out['recorder_new_us']:8.2f} µs   "
          f"old/new {out['recorder_old_to_new']:.2f}x")
    print(f"  aggregator old {out['aggregator_old_us']:8.2f} µs   new {out['aggregator_new_us']:8.2f} µs   "
          f"old/new {out['aggregator_old_to_new']:.2f}x")


if __name__ == "__main__":
    main()
