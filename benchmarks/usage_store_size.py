"""How big the usage store grows: a year of a fleet, with old hours folded into days, against the same year kept
hourly (the baseline, measured in the same run).

    python benchmarks/usage_store_size.py [--nodes 100] [--days 30] [--gpus 8] [--owners 2] [--json]

Writes, for `--nodes` × `--gpus` GPUs each shared by `--owners` owners, 400 days of usage rows and one fit row
per GPU-hour (one workload a GPU), as the engine would: rows older than `engine.usage_hourly_for` (8 days) fold
into days, and fit rows go after 92 days. The same year kept hourly is estimated from the
measured bytes per row, not written. With `--days` shorter than 400, the daily part is measured over the days
written and scaled to 400; the hourly part is the steady state whatever `--days`.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rules.usage.fits import FitAmounts, FitKey  # noqa: E402
from rules.usage.rollup import UsageAmounts, UsageBatch, UsageKey  # noqa: E402
from rules.usage.store import UsageStore  # noqa: E402

DAY = 86400
HOURLY_DAYS = 8
FITS_HOURLY_DAYS = 8
YEAR_DAYS = 400
FITS_DAYS = 92


def _hour_batch(hour: int, nodes: int, gpus: int, owners: int) -> tuple[UsageBatch, list[tuple[FitKey, FitAmounts]]]:
    usage = []
    fits = []
    for n in range(nodes):
        node = f"node-{n:04d}"
        for g in range(gpus):
            for o in range(owners):
                usage.append((UsageKey(hour, "c1", node, g, f"user{(n + g + o) % 300}", f"team{n % 8}"),
                              UsageAmounts(model="NVIDIA H100 80GB HBM3", busy_s=1200, held_s=600, free_s=0,
                                           util_s=60_000, util_known_s=1800, busy_kwh=0.2, held_kwh=0.05)))
            fits.append((FitKey(hour, "c1", f"job/slurm/{n * 100 + g}"),
                         FitAmounts(owner="u", team="t", model="H100", gpus=1, held_s=3600, peak_mem_mib=4000,
                                    mem_total_mib=81559, util_hist=[180.0] * 20, sm_hist=[0.0] * 20)))
    return UsageBatch(usage=usage), fits


def measure(nodes: int, gpus: int, owners: int, days: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "usage.sqlite"
        t0 = time.perf_counter()
        start = 20_000 * DAY
        with UsageStore(path) as store:
            for day in range(days):
                for h in range(24):
                    batch, fits = _hour_batch(start + day * DAY + h * 3600, nodes, gpus, owners)
                    store.add(batch)
                    store.add_fits(fits)
                now = start + (day + 1) * DAY  # the engine folds once an hour; once a day is the same result
                store.compact(now - HOURLY_DAYS * DAY, now - FITS_HOURLY_DAYS * DAY)
                store.prune(now - YEAR_DAYS * DAY, now - FITS_DAYS * DAY)
            usage = store.usage(0, 1e12)
            hourly = sum(1 for r in usage if r.gpu >= 0)
            daily = len(usage) - hourly
            fit_rows = len(store.fits(0, 1e12))
        with closing(sqlite3.connect(path)) as db:  # the size a long-lived store settles at
            db.execute("VACUUM")
        size = path.stat().st_size
        elapsed = time.perf_counter() - t0
    rows = hourly + daily + fit_rows
    per_row = size / max(rows, 1)
    daily_days = max(days - HOURLY_DAYS, 1)
    year_rows = (hourly + daily * (YEAR_DAYS - HOURLY_DAYS) / daily_days
                 + fit_rows * FITS_DAYS / max(min(days, FITS_DAYS), 1))
    year_bytes = year_rows * per_row
    all_hourly_bytes = nodes * gpus * owners * 24 * YEAR_DAYS * per_row
    return {"nodes": nodes, "gpus": gpus, "owners": owners, "days_written": days, "hourly_rows": hourly,
            "daily_rows": daily, "fit_rows": fit_rows, "bytes": size, "bytes_per_row": per_row,
            "year_mb_estimate": year_bytes / 1e6, "year_all_hourly_mb_estimate": all_hourly_bytes / 1e6,
            "ratio_to_all_hourly": year_bytes / all_hourly_bytes, "seconds": elapsed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--owners", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = measure(args.nodes, args.gpus, args.owners, args.days)
    if args.json:
        print(json.dumps(r, indent=2))
        return
    print(f"{r['nodes']} nodes × {r['gpus']} GPUs × {r['owners']} owners, {r['days_written']} days written: "
          f"{r['hourly_rows']:,} hourly + {r['daily_rows']:,} daily usage rows, {r['fit_rows']:,} fit rows, "
          f"{r['bytes'] / 1e6:.1f} MB ({r['bytes_per_row']:.0f} B a row)")
    print(f"a year, folded: about {r['year_mb_estimate']:.0f} MB; kept hourly: about "
          f"{r['year_all_hourly_mb_estimate']:.0f} MB (ratio {r['ratio_to_all_hourly']:.3f}); "
          f"took {r['seconds']:.0f} s")


if __name__ == "__main__":
    main()
