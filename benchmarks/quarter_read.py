"""How long a quarter's KPI (`report --weeks 13`, the dashboard's `/api/quarter`) takes to read and build: weeks
summed in SQLite (`UsageStore.week_sums`) against every row read into Python (`UsageStore.usage`, the baseline,
measured in the same run, on the same file).

    python benchmarks/quarter_read.py [--nodes 100] [--gpus 8] [--owners 2] [--hourly-days 8] [--json]

Writes 13 weeks of usage as the engine keeps it: the last `--hourly-days` days hourly (one row per GPU, owner and
hour), the days before folded into one row per day, owner and team (as `UsageStore.compact` leaves them). Then
builds the quarter both ways, three times each, and prints the best time of each, their ratio and the rows read.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpuevents.config import CostsConfig, GpuCost  # noqa: E402
from gpuevents.costs import CostModel  # noqa: E402
from rules.usage.quarter import QuarterReport, build_quarter  # noqa: E402
from rules.usage.rollup import UsageAmounts, UsageBatch, UsageKey  # noqa: E402
from rules.usage.store import UsageRow, UsageStore  # noqa: E402

DAY = 86400
WEEKS = 13
T0 = 20_000 * DAY  # a UTC midnight
COSTS = CostModel(CostsConfig(models={"H100": GpuCost(price=30000, depreciation_years=4, rated_power_w=700)}))
TEAMS = ("nlp", "vision", "speech", "infra")


def _fill(store: UsageStore, nodes: int, gpus: int, owners: int, hourly_days: int) -> None:
    days = WEEKS * 7
    for day in range(days):
        batch = UsageBatch()
        if day < days - hourly_days:  # folded: a row per day, owner and team
            for o in range(owners * nodes // 4 or 1):
                team = TEAMS[o % len(TEAMS)]
                batch.usage.append((UsageKey(T0 + day * DAY, "", "", -1, f"user{o}", team), UsageAmounts(
                    model="H100", busy_s=gpus * 3600 * 10, held_s=gpus * 3600 * 8, util_s=50 * gpus * 3600 * 18,
                    util_known_s=gpus * 3600 * 18, busy_kwh=3.0, held_kwh=1.0)))
        else:
            for h in range(24):
                for n in range(nodes):
                    team = TEAMS[n % len(TEAMS)]
                    for g in range(gpus):
                        for o in range(owners):
                            batch.usage.append((UsageKey(T0 + day * DAY + h * 3600, "c", f"n{n}", g, f"user{n}-{o}",
                                                         team), UsageAmounts(
                                model="H100", busy_s=1200, held_s=600, util_s=40 * 1800, util_known_s=1800,
                                busy_kwh=0.2, held_kwh=0.05)))
        store.add(batch)


def _best(run: Callable[[], tuple[QuarterReport, int]]) -> tuple[float, QuarterReport, int]:
    best, out = float("inf"), None
    for _ in range(3):
        t = time.perf_counter()
        out = run()
        best = min(best, time.perf_counter() - t)
    assert out is not None
    return best, out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--owners", type=int, default=2)
    ap.add_argument("--hourly-days", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    since = datetime.fromtimestamp(T0, UTC)
    until = datetime.fromtimestamp(T0 + WEEKS * 7 * DAY, UTC)
    targets = dict.fromkeys(TEAMS, 60.0)
    with tempfile.TemporaryDirectory() as tmp, UsageStore(Path(tmp) / "u.sqlite") as store:
        _fill(store, args.nodes, args.gpus, args.owners, args.hourly_days)

        def read(rows: Callable[[], list[UsageRow]]) -> Callable[[], tuple[QuarterReport, int]]:
            def run() -> tuple[QuarterReport, int]:
                got = rows()
                return build_quarter(got, COSTS, since, until, targets), len(got)
            return run

        base_s, base_q, base_rows = _best(read(lambda: store.usage(since.timestamp(), until.timestamp())))
        sums_s, sums_q, sums_rows = _best(read(lambda: store.week_sums(since.timestamp(), until.timestamp())))
    same = all(abs((a.util_pct or 0) - (b.util_pct or 0)) < 1e-6
               for sa, sb in zip([sums_q.fleet, *sums_q.teams], [base_q.fleet, *base_q.teams], strict=True)
               for a, b in zip(sa.points, sb.points, strict=True))
    result = {"nodes": args.nodes, "gpus": args.gpus, "owners": args.owners, "hourly_days": args.hourly_days,
              "every_row_s": round(base_s, 4), "every_row_rows": base_rows, "week_sums_s": round(sums_s, 4),
              "week_sums_rows": sums_rows, "ratio": round(sums_s / base_s, 4) if base_s else None, "same_kpi": same}
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.nodes} nodes x {args.gpus} GPUs x {args.owners} owners, 13 weeks ({args.hourly_days} days hourly)")
    print(f"every row into Python (baseline) {base_s * 1000:9.1f} ms  {base_rows:>9,} rows")
    print(f"weeks summed in SQLite           {sums_s * 1000:9.1f} ms  {sums_rows:>9,} rows  "
          f"ratio {result['ratio']}  same KPI: {same}")


if __name__ == "__main__":
    main()
