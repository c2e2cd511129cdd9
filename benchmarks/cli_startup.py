"""CLI startup: wall time of `gpuevents --help`, `gpuevents status --help` and `python -c "import typer"`.

    python benchmarks/cli_startup.py            # median of 7 runs each
    python benchmarks/cli_startup.py -n 15 --json

Each figure is the median wall time of a fresh interpreter (subprocess) running the command; `import typer` is
the baseline in the same run (the least a typer CLI can cost), so the ratio says what gpuevents adds on top of
the interpreter and typer. On a loaded machine the absolute figures grow; the ratio moves less. The target
(issue 27 item 7) is `--help` under 0.5 s on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CASES: dict[str, list[str]] = {
    "import typer (baseline)": [sys.executable, "-c", "import typer"],
    "gpuevents --help": [sys.executable, "-m", "gpuevents.cli", "--help"],
    "gpuevents status --help": [sys.executable, "-m", "gpuevents.cli", "status", "--help"],
    "import gpuevents.cli": [sys.executable, "-c", "import gpuevents.cli"],
}
TARGET_HELP_S = 0.5


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=7, help="runs of each command (median taken)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    for cmd in CASES.values():  # warm the file cache once
        wall(cmd)
    runs: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.n):  # interleaved, so a change of load hits every case alike
        for name, cmd in CASES.items():
            runs[name].append(wall(cmd))
    medians = {name: statistics.median(r) for name, r in runs.items()}
    base = medians["import typer (baseline)"]
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"runs": args.n, "load_1m": load, "median_s": medians,
                          "ratio_to_baseline": {k: v / base for k, v in medians.items()}}, indent=2))
        return
    print(f"{args.n} runs each, median wall time; load average (1 min) {load:.2f}")
    for name, m in medians.items():
        print(f"  {name:26} {m * 1000:7.0f} ms   x{m / base:4.1f} of import typer")
    help_s = medians["gpuevents --help"]
    print(f"gpuevents --help {'within' if help_s < TARGET_HELP_S else 'OVER'} the {TARGET_HELP_S} s target")


if __name__ == "__main__":
    main()
