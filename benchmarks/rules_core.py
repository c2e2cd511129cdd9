"""Benchmark of the rules core: compiled conditions against Jinja2, and one tick over 100,000 GPUs × 10 rules.

    python benchmarks/rules_core.py [--json] [--gpus 100000]

The last line with --json is one JSON object: condition_eval_ns_median (the library's conditions,
compiled), jinja2_eval_ns_median (the same through Jinja2's sandboxed compile_expression),
tick_100k_gpus_s (a steady tick: due sweeps of time-dependent conditions, `for` deadlines, offline checks)
and first_tick_100k_gpus_s (the first tick, which also opens every incident that is due at once).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuevents.config import Config  # noqa: E402
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, SnapshotEvent  # noqa: E402
from rules.core.core import Core, Tick  # noqa: E402
from rules.intake.check import sample_entities  # noqa: E402
from rules.lang.expr import CONDITION_ENV, jinja_names  # noqa: E402
from rules.lang.loader import load_rule_set  # noqa: E402
from rules.lang.model import RuleSet  # noqa: E402

LIBRARY = ROOT / "rules" / "library"
T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)

EXTRA_GPU_RULES = """\
rules:
  - name: bench-idle-1h
    entity: gpu
    when: gpu.idle and gpu.processes and gpu.idle_for_s > duration('1h')
    actions: [{type: log, message: "{{ gpu.id }}"}]
  - name: bench-memory-full
    entity: gpu
    when: gpu.mem_pct is not none and gpu.mem_pct > 98
    for: 5m
    actions: [{type: log, message: "{{ gpu.id }}"}]
  - name: bench-power-cap
    entity: gpu
    when: gpu.power_w is not none and gpu.power_w > gpu.power_limit_w * 0.97
    for: 10m
    actions: [{type: log, message: "{{ gpu.id }}"}]
  - name: bench-weekend-dev-idle
    entity: gpu
    when: is_weekend() and node.labels.get('env') == 'dev' and gpu.idle
    actions: [{type: log, message: "{{ gpu.id }}"}]
  - name: bench-ecc
    entity: gpu
    when: (gpu.ecc_uncorrected or 0) > 0 or gpu.lost
    actions: [{type: log, message: "{{ gpu.id }}"}]
"""


def time_ns(fn: Any, number: int) -> float:
    """Median ns per call over five runs of `number` calls."""
    runs = []
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter_ns() - t) / number)
    return statistics.median(runs)


def condition_benchmark(rules: RuleSet) -> tuple[float, float, list[dict[str, Any]]]:
    ents = sample_entities()
    rows: list[dict[str, Any]] = []
    for rule in rules:
        ctx = ents[rule.kind].ctx
        test = rule.condition.test
        names = jinja_names(ctx, rule.tz)
        expr = CONDITION_ENV.compile_expression(rule.condition.source)
        ours = time_ns(lambda test=test, ctx=ctx: test(ctx), 20000)
        theirs = time_ns(lambda expr=expr, names=names: expr(**names), 2000)
        rows.append({"rule": rule.name, "compiled_ns": round(ours), "jinja2_ns": round(theirs)})
    return (statistics.median(r["compiled_ns"] for r in rows), statistics.median(r["jinja2_ns"] for r in rows), rows)


def fleet_snapshots(gpus: int, now: datetime) -> list[SnapshotEvent]:
    """8-GPU nodes; a quarter of the GPUs idle and held, a few hot or full, one process per held GPU."""
    out = []
    per_node = 8
    for n in range(gpus // per_node):
        name = f"node-{n:05d}"
        gs, ps = [], []
        for i in range(per_node):
            k = n * per_node + i
            idle = k % 4 == 0
            util = 0.0 if idle else 40.0 + k % 60
            held = k % 10 != 9
            gs.append(GpuInfo(node=name, index=i, uuid=f"GPU-{k}", model="NVIDIA H100 80GB HBM3", util_pct=util,
                              mem_used_mib=80000.0 if k % 97 == 0 else 30000.0, mem_total_mib=81559.0,
                              temp_c=90.0 if k % 101 == 0 else 60.0, power_w=300.0, power_limit_w=700.0,
                              ecc_uncorrected=0, idle=idle,
                              idle_since=now - timedelta(minutes=k % 300) if idle else None,
                              pids=[10000 + i] if held else []))
            if held:
                ps.append(ProcessInfo(node=name, pid=10000 + i, name="python", user=f"user{k % 50}",
                                      create_time=now - timedelta(hours=k % 40), ppid=100, gpus=[i],
                                      gpu_mem_mib=30000.0, pod=f"ml/job-{k}"))
        out.append(SnapshotEvent(source=f"node/{name}", time=now,
                                 data=NodeSnapshot(node=NodeInfo(name=name, labels={"env": "dev" if n % 3 else "prod"}),
                                                   gpus=gs, processes=ps)))
    return out


def tick_benchmark(gpus: int, tmp: Path, freeze: bool = False) -> dict[str, Any]:
    lib = load_rule_set([LIBRARY, LIBRARY / "demo"])
    extra_file = tmp / "bench-rules.yaml"
    extra_file.write_text(EXTRA_GPU_RULES)
    extra = load_rule_set([extra_file])
    gpu_rules = [r for r in lib if r.kind == "gpu"] + list(extra)
    rules = RuleSet(rules=tuple(gpu_rules[:10]))
    core = Core(rules, Config.model_validate({"engine": {"offline_grace": "1h"}}))
    t = time.perf_counter()
    snaps = fleet_snapshots(gpus, T0)
    build_s = time.perf_counter() - t
    t = time.perf_counter()
    for ev in snaps:
        core.step(ev, T0)
    ingest_s = time.perf_counter() - t
    del snaps
    gc.collect()
    wakeups = []  # an online fleet: the first after the ingest takes in every node's deadline, the next none
    for _ in range(2):
        t = time.perf_counter()
        core.next_wakeup(T0 + timedelta(seconds=1))
        wakeups.append(round(time.perf_counter() - t, 4))
    if freeze:
        gc.freeze()
    t = time.perf_counter()
    first = core.step(Tick(), T0 + timedelta(seconds=1))
    first_s = time.perf_counter() - t
    steady = []
    for i in range(1, 4):
        now = T0 + timedelta(seconds=1 + 30 * i)
        t = time.perf_counter()
        out = core.step(Tick(), now)
        steady.append((time.perf_counter() - t, len(out.transitions), len(out.actions)))
    t = time.perf_counter()
    core.next_wakeup(T0 + timedelta(seconds=100))
    wakeup_s = time.perf_counter() - t
    return {
        "gpus": len(core.state.by_kind["gpu"]),
        "next_wakeup_s": round(wakeup_s, 4),
        "next_wakeup_online_s": wakeups,
        "rules": [r.name for r in rules],
        "time_dependent_rules": [r.name for r in rules if r.condition.time_dependent],
        "snapshot_build_s": round(build_s, 2),
        "snapshot_ingest_s": round(ingest_s, 2),
        "snapshot_ingest_us_per_gpu": round(ingest_s / max(1, gpus) * 1e6, 2),
        "first_tick_s": round(first_s, 3),
        "first_tick_transitions": len(first.transitions),
        "first_tick_actions": len(first.actions),
        "steady_ticks_s": [round(s[0], 3) for s in steady],
        "steady_tick_transitions": [s[1] for s in steady],
        "open_incidents": len(core.open_incidents()),
        "tick_s": statistics.median(s[0] for s in steady),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON, last line")
    ap.add_argument("--gpus", type=int, default=100_000)
    ap.add_argument("--gc-freeze", action="store_true",
                    help="gc.freeze() the loaded fleet before the ticks (made no measurable difference here)")
    args = ap.parse_args()
    import tempfile

    lib = load_rule_set([LIBRARY, LIBRARY / "demo"])
    compiled_ns, jinja_ns, rows = condition_benchmark(lib)
    with tempfile.TemporaryDirectory() as tmp:
        tick = tick_benchmark(args.gpus, Path(tmp), freeze=args.gc_freeze)
    result = {
        "condition_eval_ns_median": round(compiled_ns, 1),
        "jinja2_eval_ns_median": round(jinja_ns, 1),
        "speedup": round(jinja_ns / compiled_ns, 1),
        "tick_100k_gpus_s": round(tick["tick_s"], 3),
        "first_tick_100k_gpus_s": tick["first_tick_s"],
        "targets": {"condition_eval_ns_median": 1000, "tick_100k_gpus_s": 1.0},
        "conditions": rows,
        "gc_freeze": args.gc_freeze,
        "tick": {k: v for k, v in tick.items() if k != "tick_s"},
    }
    if not args.json:
        for r in rows:
            print(f"{r['rule']:32s} compiled {r['compiled_ns']:>7} ns   jinja2 {r['jinja2_ns']:>7} ns")
        print(f"median: compiled {compiled_ns:.0f} ns, jinja2 {jinja_ns:.0f} ns")
        print(f"tick over {tick['gpus']} GPUs x {len(tick['rules'])} rules: steady {tick['tick_s']:.3f} s, "
              f"first {tick['first_tick_s']:.3f} s ({tick['first_tick_transitions']} transitions)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
