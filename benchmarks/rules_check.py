"""`gpuevents rules check`: modules imported and wall time, reading action specs only vs loading every runtime.

    python benchmarks/rules_check.py            # median of 5 runs each, the library's rule files
    python benchmarks/rules_check.py -n 9 --json rules/library/idle.yaml

Each case is a fresh interpreter running the check in-process and reporting `len(sys.modules)` and whether an
action runtime's library (aiohttp, slack_sdk, lightkube, apprise, grpclib, nats, aiosmtplib) came in. The
baseline, in the same run, is the same check after importing every built-in's runtime, as `rules check` did
before specs and runtimes were split (issue 27 item 2); the ratio says what the split saves.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("aiohttp", "slack_sdk", "lightkube", "apprise", "grpclib", "nats", "aiosmtplib")
CHILD = """
import json, sys
from gpuevents.cli import main
if sys.argv[1] == "runtimes":
    from actions import registry
    for t in registry.types():
        registry.runtime(t)
files = sys.argv[2:]
sys.argv = ["gpuevents", "rules", "check", *files]
try:
    main()
except SystemExit:
    pass
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY_NAMES))
print(json.dumps({"modules": len(sys.modules), "heavy": heavy}), file=sys.stderr)
""".replace("HEAVY_NAMES", repr(HEAVY))
CASES = {"rules check (specs only)": "specs", "rules check + every runtime (before)": "runtimes"}


def one(mode: str, files: list[str]) -> tuple[float, dict[str, object]]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD, mode, *files], capture_output=True, text=True, check=True)
    took = time.perf_counter() - start
    return took, json.loads(done.stderr.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5, help="runs of each case (median taken)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("files", nargs="*", help="rule files (default: rules/library/*.yaml, not the tests)")
    args = ap.parse_args()
    files = args.files or sorted(str(p) for p in Path("rules/library").glob("*.yaml") if ".test." not in p.name)
    for mode in CASES.values():  # warm the file cache once
        one(mode, files)
    walls: dict[str, list[float]] = {name: [] for name in CASES}
    seen: dict[str, dict[str, object]] = {}
    for _ in range(args.n):  # interleaved, so a change of load hits both alike
        for name, mode in CASES.items():
            took, info = one(mode, files)
            walls[name].append(took)
            seen[name] = info
    medians = {name: statistics.median(w) for name, w in walls.items()}
    base_name = "rules check + every runtime (before)"
    base_s, base_mods = medians[base_name], seen[base_name]["modules"]
    assert isinstance(base_mods, int)
    if args.json:
        print(json.dumps({"runs": args.n, "files": len(files), "load_1m": os.getloadavg()[0],
                          "median_s": medians, "cases": seen,
                          "ratio_to_baseline": {k: v / base_s for k, v in medians.items()}}, indent=2))
        return
    print(f"{args.n} runs each over {len(files)} rule files, median wall time; "
          f"load average (1 min) {os.getloadavg()[0]:.2f}")
    for name, m in medians.items():
        info = seen[name]
        mods, heavy = info["modules"], info["heavy"]
        assert isinstance(mods, int) and isinstance(heavy, list)
        print(f"  {name:38} {m * 1000:6.0f} ms (x{m / base_s:4.2f})   {mods:5d} modules (x{mods / base_mods:4.2f})"
              f"   runtime libraries: {', '.join(heavy) or 'none'}")


if __name__ == "__main__":
    main()
