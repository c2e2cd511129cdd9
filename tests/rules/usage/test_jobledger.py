"""Per-job tallies from snapshots: integrated use, the moment a job ends, silence, and several nodes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuevents.events import GpuInfo, JobInfo, NodeInfo, NodeSnapshot, SnapshotEvent, make_event
from rules.usage.jobledger import JobLedger

T0 = datetime(2026, 1, 5, 9, tzinfo=UTC)


def snap(node: str, at: datetime, util: list[float], jobs: list[JobInfo], *, mem: float = 1000,
         sm: float | None = None, power: float | None = None) -> SnapshotEvent:
    gpus = [GpuInfo(node=node, index=i, model="NVIDIA H100 80GB HBM3", util_pct=u, idle=u < 5, mem_used_mib=mem,
                    sm_active_pct=sm, power_w=power) for i, u in enumerate(util)]
    event = make_event("node.snapshot", node, NodeSnapshot(node=NodeInfo(name=node), gpus=gpus, jobs=jobs), time=at)
    assert isinstance(event, SnapshotEvent)
    return event


def job(gpus: list[int], **kw: object) -> JobInfo:
    return JobInfo(id="42", user="alice", partition="gpu", gpus=gpus, **kw)


def test_a_job_tallies_its_gpus_use_and_ends_when_its_node_stops_listing_it() -> None:
    ledger = JobLedger(max_gap_s=600)
    for minute, util in ((0, 0), (1, 0), (2, 80), (3, 80)):
        ledger.observe(snap("n1", T0 + timedelta(minutes=minute), [util, util], [job([0, 1])], sm=40, power=300))
    assert ledger.drain(T0 + timedelta(minutes=3))[0].ended_at is None
    ledger.observe(snap("n1", T0 + timedelta(minutes=4), [0, 0], []))  # the epilog removed the mapping
    [t] = ledger.drain(T0 + timedelta(minutes=4))
    assert t.ended_at == T0 + timedelta(minutes=4)
    # a snapshot holds until the next: each minute counts at the sample that began it
    assert t.gpu_count == 2 and t.gpu_s == 2 * 240
    assert t.util_s / t.util_known_s == 40
    assert t.util_peak == 80 and t.sm_s / t.sm_known_s == 40
    assert t.idle_gpu_s == 2 * 120
    assert round(t.kwh, 6) == round(2 * 300 * 240 / 3.6e6, 6)
    assert ledger.jobs == {}  # an ended job is let go once drained


def test_a_job_whose_node_falls_silent_ends_when_it_was_last_seen() -> None:
    ledger = JobLedger(max_gap_s=600)
    ledger.observe(snap("n1", T0, [0], [job([0])]))
    assert ledger.drain(T0 + timedelta(minutes=5))[0].ended_at is None
    [t] = ledger.drain(T0 + timedelta(minutes=11))
    assert t.ended_at == T0


def test_a_two_node_job_ends_only_when_its_last_node_lets_it_go() -> None:
    ledger = JobLedger(max_gap_s=600)
    for n in ("n1", "n2"):
        ledger.observe(snap(n, T0, [50, 50], [job([0, 1])]))
    ledger.observe(snap("n1", T0 + timedelta(minutes=1), [0, 0], []))
    [t] = ledger.drain(T0 + timedelta(minutes=1))
    assert t.ended_at is None and t.gpu_count == 4 and t.nodes == ["n1", "n2"]
    ledger.observe(snap("n2", T0 + timedelta(minutes=2), [0, 0], []))
    [t] = ledger.drain(T0 + timedelta(minutes=2))
    assert t.ended_at == T0 + timedelta(minutes=2)
