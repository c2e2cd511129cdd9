#!/usr/bin/env python3
"""Real-GPU check: run the agent's NVML sampler for a few seconds, print every field and each NVML call's latency.

    python scripts/check_nvml.py              # 5 samples, 1 s apart
    python scripts/check_nvml.py --seconds 10 --interval 0.5
    sudo python scripts/check_nvml.py --power-cap   # also lower each GPU's power limit and put it back

It lists each device (MIG instances with their GPU instance id and profile) and whether it has GPM
(Hopper and later: SM, tensor and DRAM activity; the first sample has none, as GPM compares two).
Exit status: 0 when every sample read cleanly; 1 on any failure (an NVML error other than "not
supported", a lost GPU, a physical GPU without utilization or memory, a GPM device that gave no
activity after its second sample, no GPU at all); 2 when NVML does not load here. Queries a GPU does
not support are listed, and are not failures.

With `--power-cap` (root; it changes the GPUs' limits for a moment) it checks what the `power_cap` command
does: each whole GPU's bounds (`nvmlDeviceGetPowerManagementLimitConstraints`), its limit
(`nvmlDeviceGetPowerManagementLimit`) set to the minimum (`nvmlDeviceSetPowerManagementLimit`) and read back, then
put back and read back again. Any step that fails, or a limit that does not read back as set, is a failure.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.attribution import PsutilIdentifier
from agent.nvml import NvmlSampler
from agent.nvmlcalls import NvmlUnavailable
from agent.sample import NodeReading, PowerLimitError

GPU_FIELDS = ("uuid", "model", "util_pct", "mem_used_mib", "mem_total_mib", "mem_pct", "temp_c", "power_w",
              "power_limit_w", "fan_pct", "ecc_uncorrected", "mig_parent", "lost",
              "sm_clock_mhz", "mem_clock_mhz", "mem_temp_c", "energy_mj", "pcie_replays", "mem_copy_util_pct",
              "enc_util_pct", "dec_util_pct", "mem_reserved_mib", "remapped_rows_correctable",
              "remapped_rows_uncorrectable", "row_remap_failure", "xid_watched", "pci_bus_id",
              "mig_gi_id", "mig_profile",
              "gr_engine_active_pct", "sm_active_pct", "tensor_active_pct", "dram_active_pct",
              "pcie_tx_bytes_s", "pcie_rx_bytes_s")


def _fmt(v: Any) -> str:
    return "null" if v is None else str(v)


def print_reading(n: int, r: NodeReading, sampler: NvmlSampler, elapsed_ms: float, out: TextIO) -> None:
    print(f"\n--- sample {n}: {len(r.gpus)} GPU(s), {len(r.procs)} process row(s), "
          f"{len(r.xids)} XID(s), sample() took {elapsed_ms:.2f} ms", file=out)
    for g in r.gpus:
        fields = " ".join(f"{f}={_fmt(getattr(g, f))}" for f in GPU_FIELDS)
        print(f"gpu {g.index}: {fields}", file=out)
    pids = {p.pid for p in r.procs}
    idents = sampler.identify(pids) if pids else {}
    for p in r.procs:
        i = idents.get(p.pid)
        who = (f"user={i.user} name={i.name} create_time={i.create_time.isoformat()} "
               f"container_id={_fmt(i.container_id)} pod_uid={_fmt(i.pod_uid)} cmdline={i.cmdline[:80]!r}"
               if i else "identity=unreadable")
        print(f"  pid {p.pid} on gpu {p.gpu}: mem_mib={_fmt(p.mem_mib)} sm_util_pct={_fmt(p.sm_util_pct)} {who}",
              file=out)
    for x in r.xids:
        print(f"  XID {x.xid} on gpu {x.gpu}", file=out)


def describe_devices(sampler: NvmlSampler, out: TextIO) -> None:
    for d in sampler.devices:
        mig = (f" (MIG of {d.mig_parent}: GPU instance {_fmt(d.gi_id)}, profile {_fmt(d.profile)})"
               if d.mig_parent else "")
        gpm = "GPM: yes" if d.index in sampler.gpm.watched else "GPM: no"
        print(f"device {d.index}: {d.model} {d.uuid}{mig}" + (" [MIG enabled]" if d.is_mig_parent else "")
              + f"; {gpm}; PCI {_fmt(d.pci_bus_id)}", file=out)


GPM_CALLS = ("nvmlGpmSampleGet", "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet")
GPM_FIELDS = ("gr_engine_active_pct", "sm_active_pct", "tensor_active_pct", "dram_active_pct")


def gpm_problems(r: NodeReading, sampler: NvmlSampler, n: int) -> list[str]:
    """A GPM device has activity from its second sample on, unless the driver said a GPM call is not supported
    (listed, not a failure); a call that failed otherwise is in the errors already."""
    if n < 2:
        return []
    out = []
    for g in r.gpus:
        if g.index not in sampler.gpm.watched or g.lost:
            continue
        if any((g.index, c) in sampler._unsupported for c in GPM_CALLS):
            continue
        if all(getattr(g, f) is None for f in GPM_FIELDS):
            out.append(f"gpu {g.index}: GPM is supported but sample {n} has no activity metric")
    return out


def problems_in(r: NodeReading, mig_parents: set[int]) -> list[str]:
    """Missing essentials; MIG parents and instances have no utilization in NVML, so they are spared."""
    out = []
    for g in r.gpus:
        if g.lost:
            out.append(f"gpu {g.index} ({g.uuid}) is lost")
        elif g.mig_parent is None and g.index not in mig_parents:
            missing = [f for f in ("util_pct", "mem_used_mib", "mem_total_mib") if getattr(g, f) is None]
            if missing:
                out.append(f"gpu {g.index}: no {', '.join(missing)}")
        if not g.uuid:
            out.append(f"gpu {g.index}: no uuid")
    return out


def power_cap_problems(sampler: NvmlSampler, out: TextIO) -> list[str]:
    """Lower each whole GPU's limit to its minimum, read it back, put it back, read that back."""
    problems = []
    for d in sampler.devices:
        if d.mig_parent is not None or d.lost:
            continue
        try:
            low, high = sampler.power_bounds(d.index)
            before = sampler.power_limit(d.index)
            sampler.set_power_limit(d.index, low)
            capped = sampler.power_limit(d.index)
            sampler.set_power_limit(d.index, before)
            after = sampler.power_limit(d.index)
        except PowerLimitError as e:
            problems.append(f"gpu {d.index}: power cap: {e}")
            continue
        print(f"gpu {d.index}: power limit bounds {low:g}-{high:g} W; {before:g} W -> {capped:g} W -> {after:g} W",
              file=out)
        if abs(capped - low) > 0.5 or abs(after - before) > 0.5:
            problems.append(f"gpu {d.index}: power limit read back {capped:g} W capped, {after:g} W restored "
                            f"(set {low:g} W, then {before:g} W)")
    return problems


def run_check(nvml: Any = None, *, seconds: float = 5.0, interval: float = 1.0, out: TextIO = sys.stdout,
              power_cap: bool = False) -> int:
    t0 = time.perf_counter()
    try:
        sampler = NvmlSampler(nvml, identifier=PsutilIdentifier(), timing=True)
    except NvmlUnavailable as e:
        print(f"FAIL: {e}", file=out)
        return 2
    print(f"NVML initialised in {(time.perf_counter() - t0) * 1000:.1f} ms; driver {sampler.driver_version}",
          file=out)
    describe_devices(sampler, out)
    print(f"XID events: {'registered' if sampler._event_set is not None else 'not supported here'}", file=out)
    problems: list[str] = []
    if not sampler.devices:
        problems.append("NVML lists no GPU")
    sample_ms: list[float] = []
    n = 0
    deadline = time.monotonic() + seconds
    try:
        while True:
            n += 1
            s0 = time.perf_counter()
            reading = sampler.sample(datetime.now(UTC))
            sample_ms.append((time.perf_counter() - s0) * 1000)
            print_reading(n, reading, sampler, sample_ms[-1], out)
            mig_parents = {d.index for d in sampler.devices if d.is_mig_parent}
            found = problems_in(reading, mig_parents) + gpm_problems(reading, sampler, n)
            problems += [p for p in found if p not in problems]
            if time.monotonic() + interval > deadline:
                break
            time.sleep(interval)  # the sampling interval itself, as the agent keeps it
    except Exception as e:  # any crash of the sampler is exactly what this check is for
        problems.append(f"sampler raised {type(e).__name__}: {e}")
    try:
        if power_cap:
            print("\n--- power limits (power_cap)", file=out)
            problems += power_cap_problems(sampler, out)
    finally:
        sampler.close()

    print("\n--- NVML call latency (ms)", file=out)
    print(f"{'call':48} {'calls':>6} {'errors':>6} {'mean':>9} {'max':>9}  codes", file=out)
    for name, st in sorted(sampler.stats.items()):
        mean = st.total_s / st.calls * 1000 if st.calls else 0.0
        codes = ",".join(map(str, sorted(st.codes)))
        print(f"{name:48} {st.calls:6d} {st.errors:6d} {mean:9.3f} {st.max_s * 1000:9.3f}  {codes}", file=out)
    if sample_ms:
        print(f"{'sample() whole':48} {len(sample_ms):6d} {0:6d} {sum(sample_ms) / len(sample_ms):9.3f} "
              f"{max(sample_ms):9.3f}", file=out)
    unsupported = sorted(sampler._unsupported)
    if unsupported:
        print("\nnot supported (reported as null, not a failure): "
              + ", ".join(f"gpu {i}: {name}" for i, name in unsupported), file=out)
    problems += sampler.errors
    if problems:
        print("\nFAIL:", file=out)
        for p in problems:
            print(f"  - {p}", file=out)
        return 1
    print(f"\nOK: {n} samples of {len(sampler.devices)} device(s), no failures", file=out)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--power-cap", action="store_true", help="also lower each GPU's power limit and put it back")
    args = ap.parse_args()
    return run_check(seconds=args.seconds, interval=args.interval, power_cap=args.power_cap)


if __name__ == "__main__":
    sys.exit(main())
