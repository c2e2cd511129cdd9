"""A simulated day of two nodes, built from snapshot events, with totals worked out by hand."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, SnapshotEvent, make_event

DAY_START = datetime(2026, 1, 5, tzinfo=UTC)  # a Monday
STEP_S = 60
OUTAGE = (14 * 3600, 16 * 3600)  # n1 sends nothing in [14:00, 16:00)
TEAMS = {"bob@example.com": "nlp"}

# n1 (label team=vision), two H100 at a measured 100 W:
#   gpu0: alice's pod busy at 90 % 00–08, held idle 08–12, then free; gpu1 free all day.
#   The outage is counted for 3 minutes (3 snapshot intervals after 13:59), so 1h58m are lost.
# n2 (no label), one A100 with no power reading (rated 400 W):
#   gpu0 held idle by bob and carol 00–06 (split in two), then bob busy at 50 % 06–24.
COUNTED_N1_H = 24 - (1 + 58 / 60)
EXPECTED = {
    ("vision", "alice@example.com"): {"busy_h": 8.0, "held_h": 4.0, "util": 60.0},
    ("vision", ""): {"free_h": (12 - (1 + 58 / 60)) + COUNTED_N1_H},
    ("nlp", "bob@example.com"): {"busy_h": 18.0, "held_h": 3.0},
    ("", "carol@example.com"): {"held_h": 3.0},
}
ENERGY_KWH = 2 * COUNTED_N1_H * 0.1 + 24 * 0.4


def _proc(node: str, pid: int, user: str, gpus: list[int], pod: str | None = None) -> ProcessInfo:
    return ProcessInfo(
        node=node, pid=pid, name="python", user=user, owner=f"{user}@example.com",
        create_time=DAY_START - timedelta(hours=1), gpus=gpus, pod=pod,
    )


def n1_snapshot(t: int) -> NodeSnapshot:
    alice = _proc("n1", 4242, "alice", [0], pod="vision/train-1")
    if t < 8 * 3600:
        gpu0 = GpuInfo(node="n1", index=0, model="NVIDIA H100 80GB HBM3", util_pct=90, power_w=100,
                       pids=[4242], owners=["alice@example.com"], owner="alice@example.com")
        procs = [alice]
    elif t < 12 * 3600:
        gpu0 = GpuInfo(node="n1", index=0, model="NVIDIA H100 80GB HBM3", util_pct=0, power_w=100,
                       idle=True, pids=[4242], owners=["alice@example.com"], owner="alice@example.com")
        procs = [alice]
    else:
        gpu0 = GpuInfo(node="n1", index=0, model="NVIDIA H100 80GB HBM3", util_pct=0, power_w=100, idle=True)
        procs = []
    gpu1 = GpuInfo(node="n1", index=1, model="NVIDIA H100 80GB HBM3", util_pct=0, power_w=100, idle=True)
    return NodeSnapshot(node=NodeInfo(name="n1", labels={"team": "vision"}, gpu_count=2),
                        gpus=[gpu0, gpu1], processes=procs)


def n2_snapshot(t: int) -> NodeSnapshot:
    bob = _proc("n2", 100, "bob", [0])
    if t < 6 * 3600:
        carol = _proc("n2", 200, "carol", [0])
        gpu = GpuInfo(node="n2", index=0, model="NVIDIA A100-SXM4-40GB", util_pct=1, idle=True,
                      pids=[100, 200])
        procs = [bob, carol]
    else:
        gpu = GpuInfo(node="n2", index=0, model="NVIDIA A100-SXM4-40GB", util_pct=50, pids=[100])
        procs = [bob]
    return NodeSnapshot(node=NodeInfo(name="n2", gpu_count=1), gpus=[gpu], processes=procs)


def day_events() -> Iterator[SnapshotEvent]:
    """Both nodes' snapshots in time order, one a minute, n1 silent during the outage."""
    for t in range(0, 24 * 3600, STEP_S):
        at = DAY_START + timedelta(seconds=t)
        if not OUTAGE[0] <= t < OUTAGE[1]:
            yield make_event("node.snapshot", "n1", n1_snapshot(t), time=at)
        yield make_event("node.snapshot", "n2", n2_snapshot(t), time=at)
