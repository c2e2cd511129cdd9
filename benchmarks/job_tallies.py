"""Benchmark of what jobs add to the engine's per-snapshot work: the job ledger (summaries) against the usage
aggregator it runs beside, and a condition reading `demand` against one reading a GPU field.

    python benchmarks/job_tallies.py [--json] [--snapshots 20000]

Each snapshot is one 8-GPU node with 4 jobs of 2 GPUs. Prints the median cost per snapshot of
`JobLedger.observe` and of `UsageAggregator.observe` (the baseline, same snapshots, same run) and their ratio;
then the median cost of evaluating `job.idle and demand.pending_gpus > 0 and demand.waiting_for_s > 600`
against `job.idle and job.util_pct < 5` (compiled) on the same job entity.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuevents.config import Config  # noqa: E402
from gpuevents.events import (  # noqa: E402
    SCHEDULER_SOURCE,
    DemandEntry,
    DemandEvent,
    DemandReport,
    GpuInfo,
    JobInfo,
    NodeInfo,
    NodeSnapshot,
    SnapshotEvent,
)
from rules.core.core import Core  # noqa: E402
from rules.lang.loader import load_rule_set  # noqa: E402
from rules.usage.jobledger import JobLedger  # noqa: E402
from rules.usage.rollup import TeamResolver, UsageAggregator  # noqa: E402

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def snapshots(n: int) -> list[SnapshotEvent]:
    out = []
    for i in range(n):
        at = T0 + timedelta(seconds=15 * i)
        gpus = [GpuInfo(node="n1", index=g, model="NVIDIA H100 80GB HBM3", util_pct=(i + g) % 100,
                        idle=(i + g) % 100 < 5, mem_used_mib=20000, power_w=300, sm_active_pct=40) for g in range(8)]
        jobs = [JobInfo(id=str(1000 + j), user="alice", partition="gpu", gpus=[2 * j, 2 * j + 1]) for j in range(4)]
        out.append(SnapshotEvent(source="node/n1", cluster="c1", time=at,
                                 data=NodeSnapshot(node=NodeInfo(name="n1", cluster="c1"), gpus=gpus, jobs=jobs)))
    return out


def per_call_ns(fn: Callable[[object], object], items: list[object], rounds: int = 5) -> float:
    samples = []
    for _ in range(rounds):
        gc.collect()
        t = time.perf_counter_ns()
        for x in items:
            fn(x)
        samples.append((time.perf_counter_ns() - t) / len(items))
    return statistics.median(samples)


def condition_ns(expr: str, core: Core, n: int, tmp: Path) -> float:
    f = tmp / "bench.yaml"
    f.write_text(f"rules:\n  - name: b\n    entity: job\n    when: \"{expr}\"\n"
                 "    actions: [{type: log, message: x}]\n")
    test = load_rule_set([f]).by_name["b"].condition.test
    ent = next(iter(core.state.by_kind["job"].values()))
    ctx = ent.ctx
    clock = core.clock
    instants = [T0 + timedelta(microseconds=i) for i in range(n)]
    samples = []
    for _ in range(5):
        t = time.perf_counter_ns()
        for at in instants:  # a new instant each time, as each tick is: nothing read at the last one is reused
            clock.set(at)
            test(ctx)
        samples.append((time.perf_counter_ns() - t) / n)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--snapshots", type=int, default=20000)
    args = ap.parse_args()
    snaps = snapshots(args.snapshots)

    def ledger_pass(_: object) -> None:
        led = JobLedger(600)
        for s in snaps:
            led.observe(s)

    def aggregator_pass(_: object) -> None:
        agg = UsageAggregator(snapshot_interval=15, teams=TeamResolver())
        for s in snaps:
            agg.observe(s, s.time)

    ledger = per_call_ns(ledger_pass, [None]) / len(snaps)
    baseline = per_call_ns(aggregator_pass, [None]) / len(snaps)

    core = Core(load_rule_set([]), Config(cluster="c1"))
    core.step(snaps[0], T0)
    report = DemandReport(scheduler="slurm", entries=[DemandEntry(partition="gpu", pending_gpus=4,
                                                                  waiting_since=T0 - timedelta(minutes=20))])
    core.step(DemandEvent(source=f"node/{SCHEDULER_SOURCE}", cluster="c1", time=T0, data=report), T0)
    with tempfile.TemporaryDirectory() as tmp:
        with_demand = condition_ns("job.idle and demand.pending_gpus > 0 and demand.waiting_for_s > 600", core,
                                   100000, Path(tmp))
        plain = condition_ns("job.idle and job.util_pct < 5", core, 100000, Path(tmp))
    out = {"ledger_observe_us": round(ledger / 1000, 2), "aggregator_observe_us": round(baseline / 1000, 2),
           "ledger_to_aggregator": round(ledger / baseline, 2),
           "demand_condition_ns": round(with_demand), "plain_condition_ns": round(plain),
           "demand_to_plain": round(with_demand / plain, 2)}
    print(f"JobLedger.observe        {out['ledger_observe_us']:8.2f} µs / 8-GPU, 4-job snapshot")
    print(f"UsageAggregator.observe  {out['aggregator_observe_us']:8.2f} µs (baseline)  ratio "
          f"{out['ledger_to_aggregator']}")
    print(f"condition with demand    {out['demand_condition_ns']:8d} ns; without {out['plain_condition_ns']} ns; "
          f"ratio {out['demand_to_plain']}")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
