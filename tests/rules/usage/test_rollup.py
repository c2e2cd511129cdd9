"""Usage rollups: a simulated day against totals worked out by hand; gaps, hours and redelivery."""

from __future__ import annotations

import copy
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import pytest

from gpuevents import agentdata
from gpuevents.config import Config, CostsConfig
from gpuevents.costs import CostModel
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, SnapshotEvent, make_event
from rules.usage.recorder import UsageRecorder
from rules.usage.rollup import TeamResolver, UsageAggregator, UsageBatch
from rules.usage.store import UsageStore
from tests.rules.dashboard.fleetday import DAY_START, ENERGY_KWH, EXPECTED, TEAMS, day_events

COSTS = CostsConfig.model_validate({"models": {"A100": {"price": 10000, "rated_power_w": 400},
                                               "H100": {"price": 30000, "rated_power_w": 700}}})


def _aggregator(interval: float = 60) -> UsageAggregator:
    costs = CostModel(COSTS)
    return UsageAggregator(
        snapshot_interval=interval,
        teams=TeamResolver(team_label="team", teams=TEAMS),
        rated_power_w=lambda m: costs.gpu_cost(m).rated_power_w,
    )


def _simulated_day() -> UsageBatch:
    agg = _aggregator()
    for event in day_events():
        agg.observe(event, event.time)
    agg.settle(DAY_START + timedelta(days=1))
    return agg.drain()


@pytest.fixture(scope="module")
def day() -> UsageBatch:
    return _simulated_day()


def _totals(batch: UsageBatch) -> dict[tuple[str, str], dict[str, float]]:
    out: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for k, a in batch.usage:
        t = out[(k.team, k.owner)]
        t["busy_h"] += a.busy_s / 3600
        t["held_h"] += a.held_s / 3600
        t["free_h"] += a.free_s / 3600
        t["util_s"] += a.util_s
        t["util_known_s"] += a.util_known_s
    return out


def test_simulated_day_gives_the_hand_computed_gpu_hours(day: UsageBatch) -> None:
    totals = _totals(day)
    assert set(totals) == set(EXPECTED)
    for who, expected in EXPECTED.items():
        for name in ("busy_h", "held_h", "free_h"):
            assert totals[who][name] == pytest.approx(expected.get(name, 0.0), abs=1e-9), (who, name)


def test_utilization_is_time_weighted(day: UsageBatch) -> None:
    alice = _totals(day)[("vision", "alice@example.com")]
    assert alice["util_s"] / alice["util_known_s"] == pytest.approx(60.0)


def test_energy_uses_measured_power_else_rated(day: UsageBatch) -> None:
    kwh = sum(a.busy_kwh + a.held_kwh + a.free_kwh for _, a in day.usage)
    assert kwh == pytest.approx(ENERGY_KWH)


def test_an_outage_is_not_counted_past_three_intervals(day: UsageBatch) -> None:
    n1_14h = sum(a.free_s for k, a in day.usage if k.node == "n1" and k.hour == int(DAY_START.timestamp()) + 14 * 3600)
    assert n1_14h == pytest.approx(2 * 2 * 60)  # 14:00–14:02 on two GPUs
    n1_15h = [a for k, a in day.usage if k.node == "n1" and k.hour == int(DAY_START.timestamp()) + 15 * 3600]
    assert n1_15h == []


def test_every_counted_gpu_hour_lands_in_its_own_bucket(day: UsageBatch) -> None:
    per_bucket: dict[tuple[int, str, int], float] = defaultdict(float)
    for k, a in day.usage:
        per_bucket[(k.hour, k.node, k.gpu)] += a.busy_s + a.held_s + a.free_s
    assert max(per_bucket.values()) == pytest.approx(3600)
    assert len({h for h, _, _ in per_bucket}) == 24


def test_idle_jobs_are_split_between_the_processes_on_the_gpu(day: UsageBatch) -> None:
    held: dict[str, float] = defaultdict(float)
    names: dict[str, str] = {}
    for _, a in day.idle_jobs:
        held[a.owner] += a.held_s / 3600
        names[a.owner] = a.name
    assert held == pytest.approx({"alice@example.com": 4.0, "bob@example.com": 3.0, "carol@example.com": 3.0})
    assert names["alice@example.com"] == "vision/train-1"
    assert names["bob@example.com"] == "python (pid 100)"


def _one_gpu(node: str, t: float, util: float, idle: bool = False) -> SnapshotEvent:
    snap = NodeSnapshot(node=NodeInfo(name=node), gpus=[GpuInfo(node=node, index=0, util_pct=util, idle=idle)])
    return make_event("node.snapshot", node, snap, time=DAY_START + timedelta(seconds=t))


def test_a_redelivered_snapshot_is_counted_once() -> None:
    agg = _aggregator(interval=15)
    first, second = _one_gpu("n", 0, 80), _one_gpu("n", 15, 80)
    for e in (first, second, second, first):
        agg.observe(e, e.time)
    busy = sum(a.busy_s for _, a in agg.drain().usage)
    assert busy == pytest.approx(15)


def test_an_interval_across_the_hour_is_split_between_buckets() -> None:
    agg = _aggregator(interval=15)
    for t in (3590, 3600 + 5):
        e = _one_gpu("n", t, 50)
        agg.observe(e, e.time)
    parts = {k.hour - int(DAY_START.timestamp()): a.busy_s for k, a in agg.drain().usage}
    assert parts == pytest.approx({0: 10.0, 3600: 5.0})


def test_a_snapshot_from_the_future_is_clamped_to_now() -> None:
    agg = _aggregator(interval=15)
    agg.observe(_one_gpu("n", 0, 50), DAY_START)
    late = _one_gpu("n", 3600, 50)  # the agent's clock is an hour ahead
    agg.observe(late, DAY_START + timedelta(seconds=10))
    assert sum(a.busy_s for _, a in agg.drain().usage) == pytest.approx(10)


def test_store_adds_batches_up_and_prunes_by_age(tmp_path: Path, day: UsageBatch) -> None:
    with UsageStore(tmp_path / "u.sqlite") as store:
        store.add(day)
        store.add(day)
        start = DAY_START.timestamp()
        rows = store.usage(start, start + 86400, team="vision")
        assert sum(r.busy_s for r in rows) / 3600 == pytest.approx(16.0)
        jobs = store.idle_jobs(start, start + 86400)
        assert sum(j.held_s for j in jobs) / 3600 == pytest.approx(20.0)
        removed = store.prune(start + 12 * 3600)
        assert removed > 0
        assert all(r.hour >= start + 12 * 3600 for r in store.usage(0, 2**40))


async def test_recorder_writes_settled_buckets_and_keeps_them_across_reopen(tmp_path: Path) -> None:
    config = Config.model_validate({"engine": {"usage_db": str(tmp_path / "db" / "usage.sqlite")},
                                    "agent": {"snapshot_interval": 15}})
    recorder = UsageRecorder.from_config(config)
    recorder.observe(_one_gpu("n", 0, 40), DAY_START)
    await recorder.flush(DAY_START + timedelta(seconds=30))
    recorder.observe(_one_gpu("n", 30, 40), DAY_START + timedelta(seconds=30))
    recorder.observe(_one_gpu("n2", 30, 0, idle=True), DAY_START + timedelta(seconds=30))
    waste = await recorder.flush(DAY_START + timedelta(seconds=40))
    recorder.close()
    with UsageStore(tmp_path / "db" / "usage.sqlite") as store:
        rows = store.usage(0, 2**40)
    assert sum(r.busy_s for r in rows) == pytest.approx(40)
    assert sum(r.util_s for r in rows) == pytest.approx(40 * 40)
    # n2 was free for 10 s: default GPU (25000 over 4 years, 700 W rated, 0.12 per kWh)
    assert waste.held_idle == 0
    assert waste.unallocated == pytest.approx((25000 / 4 / 365 + 0.7 * 24 * 0.12) / 86400 * 10)


def test_a_repeated_snapshot_object_counts_like_equal_copies_across_drains_and_hours() -> None:
    """The engine hands a node's repeated snapshot over as the very object it holds; the aggregator then
    keeps that snapshot's plan and buckets. Totals must equal counting fresh copies, drains in between."""
    held: dict[str, agentdata.NodeSnapshot] = {}
    shared = []
    for e in day_events():
        last = held.get(e.node)
        if last is not None and last == e.data:
            e = e.model_copy(update={"data": last})
        held[e.node] = e.data
        shared.append(e)
    assert sum(a is not b for a, b in zip(shared, day_events(), strict=True)) > 0
    assert sum(e.data is held[e.node] for e in shared) < len(shared)  # the day's snapshots do change

    fresh, reused = _aggregator(), _aggregator()
    batches: list[UsageBatch] = []
    for i, (a, b) in enumerate(zip(day_events(), shared, strict=True)):
        fresh.observe(a, a.time)
        reused.observe(b, b.time)
        if i % 37 == 0:
            batches.append(copy.deepcopy(reused.drain()))  # as written: later counts must not land in it
    end = DAY_START + timedelta(days=1)
    fresh.settle(end)
    reused.settle(end)
    batches.append(reused.drain())
    merged = _aggregator()
    for batch in batches:
        merged.restore(batch)
    expected, got = fresh.drain(), merged.drain()
    assert dict(got.usage).keys() == dict(expected.usage).keys()
    for key, amounts in expected.usage:
        other = dict(got.usage)[key]
        for name in ("busy_s", "held_s", "free_s", "util_s", "busy_kwh", "held_kwh", "free_kwh"):
            assert getattr(other, name) == pytest.approx(getattr(amounts, name)), (key, name)
    assert {k: pytest.approx(j.held_s) for k, j in expected.idle_jobs} == {k: j.held_s for k, j in got.idle_jobs}


def _mig_node(t: float) -> SnapshotEvent:
    """One A100 split into three MIG instances: the parent and its instances are all reported."""
    gpus = [GpuInfo(node="m", index=0, uuid="GPU-parent", model="A100", util_pct=None, idle=False)]
    gpus += [GpuInfo(node="m", index=1 + i, uuid=f"MIG-{i}", model="A100", mig_parent="GPU-parent",
                     util_pct=50, idle=False) for i in range(3)]
    snap = NodeSnapshot(node=NodeInfo(name="m"), gpus=gpus)
    return make_event("node.snapshot", "m", snap, time=DAY_START + timedelta(seconds=t))


def test_a_mig_gpu_is_counted_once_not_once_for_the_parent_and_once_per_instance() -> None:
    agg = _aggregator(interval=60)
    for t in range(0, 3601, 60):
        e = _mig_node(t)
        agg.observe(e, e.time)
    usage = agg.drain().usage
    assert sum(a.busy_s for _, a in usage) / 3600 == pytest.approx(1.0)  # one physical GPU for an hour
    assert {k.gpu for k, _ in usage} == {1, 2, 3}
    assert sum(a.busy_kwh for _, a in usage) == pytest.approx(0.4)  # the rated 400 W for an hour, once


def test_the_fleet_view_costs_a_mig_gpu_once() -> None:
    from rules.dashboard.fleet_view import fleet_view

    snap = _mig_node(0).data
    snap = agentdata.replace(snap, gpus=[  # held idle: each instance has a process
        agentdata.replace(g, idle=True, pids=[100 + g.index] if g.mig_parent else []) for g in snap.gpus])
    costs = CostModel(COSTS)
    view = fleet_view([snap], DAY_START, costs)
    assert [g.index for g in view.nodes[0].gpus] == [1, 2, 3]
    assert view.held_idle_cost_per_hour == pytest.approx(costs.hourly("A100", None))


def test_a_scheduler_job_is_the_idle_job_and_an_allocated_gpu_with_nothing_on_it_is_held() -> None:
    from gpuevents.events import ProcessInfo
    from rules.usage.weekly import job_id

    agg = _aggregator()
    dave = ProcessInfo(node="n5", pid=11, name="python", user="dave", create_time=DAY_START, gpus=[0], job="812345")
    snap = NodeSnapshot(node=NodeInfo(name="n5"), gpus=[
        GpuInfo(node="n5", index=0, util_pct=0, idle=True, pids=[11], allocated=True, job="812345"),
        GpuInfo(node="n5", index=1, util_pct=0, idle=True, allocated=True, job="812399", owner="erin"),
        GpuInfo(node="n5", index=2, util_pct=0, idle=True, allocated=False),
    ], processes=[dave])
    for minute in (0, 1):
        at = DAY_START + timedelta(minutes=minute)
        agg.observe(make_event("node.snapshot", "n5", snap, time=at), at)
    batch = agg.drain()
    jobs = {(k.gpu, job_id(k.job), a.owner, a.name): a.held_s for k, a in batch.idle_jobs}
    assert jobs == {(0, "812345", "dave", "python (job 812345)"): 60.0, (1, "812399", "erin", "job 812399"): 60.0}
    held = {k.gpu: (k.owner, a.held_s, a.free_s) for k, a in batch.usage}
    assert held == {0: ("dave", 60.0, 0.0), 1: ("erin", 60.0, 0.0), 2: ("", 0.0, 60.0)}


def test_an_allocated_gpu_with_nothing_on_it_belongs_to_its_jobs_user() -> None:
    from gpuevents.events import JobInfo
    from rules.usage.weekly import job_id

    agg = UsageAggregator(snapshot_interval=60, teams=TeamResolver(owners={"frank": "frank@example.com"}))
    snap = NodeSnapshot(node=NodeInfo(name="n6"), jobs=[JobInfo(id="900001", user="frank", name="sweep", gpus=[0])],
                        gpus=[GpuInfo(node="n6", index=0, util_pct=0, idle=True, allocated=True, job="900001")])
    for minute in (0, 1):
        at = DAY_START + timedelta(minutes=minute)
        agg.observe(make_event("node.snapshot", "n6", snap, time=at), at)
    batch = agg.drain()
    assert [(k.owner, a.held_s) for k, a in batch.usage] == [("frank@example.com", 60.0)]
    assert [(job_id(k.job), a.name, a.owner) for k, a in batch.idle_jobs] == [
        ("900001", "sweep (job 900001)", "frank@example.com")]
