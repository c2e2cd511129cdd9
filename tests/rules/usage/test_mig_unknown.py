"""A simulated A100 fleet with MIG and no GPM, every holder idle: no GPU-hour is counted busy anywhere the
usage store feeds (weekly report, KPI shares), and the held MIG instances are counted as `unknown`."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agent.core import NodeCore
from agent.scenario import load_scenario
from agent.simulate import SimulatedNode
from gpuevents.config import CostsConfig, ThresholdsConfig
from gpuevents.costs import CostModel
from gpuevents.events import SnapshotEvent
from rules.usage.rollup import UsageAggregator
from rules.usage.store import UsageStore
from rules.usage.sums import UsageSum
from rules.usage.weekly import build_report

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
HOURS = 4


def _simulate(store: UsageStore) -> list[SnapshotEvent]:
    scenario = load_scenario("a100-mig")
    aggregator = UsageAggregator(snapshot_interval=15.0)
    snaps: list[SnapshotEvent] = []
    for n, node in enumerate(("a100-1", "a100-2")):
        sim = SimulatedNode(scenario, node=node, node_index=n, gpus=4, seed=7, start=T0)
        core = NodeCore(node=node, cluster="c", thresholds=ThresholdsConfig(), snapshot_interval_s=15)
        t = T0
        while t < T0 + timedelta(hours=HOURS):
            reading = sim.sample(t)
            idents = sim.identify({p.pid for p in reading.procs})
            for e in core.step(t, reading, idents):
                if isinstance(e, SnapshotEvent):
                    aggregator.observe(e, t)
                    snaps.append(e)
            t += timedelta(seconds=15)
    aggregator.settle(T0 + timedelta(hours=HOURS))
    store.add(aggregator.drain())
    return snaps


def test_an_idle_a100_mig_fleet_counts_no_gpu_hour_busy() -> None:
    store = UsageStore(":memory:")
    snaps = _simulate(store)
    instances = [g for s in snaps for g in s.data.gpus if g.mig_parent is not None]
    assert any(g.pids for g in instances), "the scenario holds MIG instances"
    assert all(not g.activity_known and not g.idle for g in instances if g.pids)
    assert all(g.idle for g in instances if not g.pids)  # nothing on it: free
    rows = store.usage(T0.timestamp(), (T0 + timedelta(hours=HOURS)).timestamp())
    costs = CostModel(CostsConfig())
    total = UsageSum()
    for r in rows:
        total.add(r, costs)
    assert total.busy_h == 0.0
    assert total.unknown_h > 0.0 and total.held_h > 0.0
    assert total.busy_share == 0.0  # of the GPU-hours held, none used
    report = build_report(rows, [], costs, since=T0, until=T0 + timedelta(hours=HOURS), generated_at=T0)
    assert report.fleet.busy_h == 0.0
    assert report.fleet.unknown_h == total.unknown_h
    # every GPU-hour is somewhere: 2 nodes × (3 whole GPUs + one MIG GPU counted through its instances)
    assert abs(report.fleet.gpu_h - 2 * 4 * HOURS) < 0.1


def test_an_older_usage_file_gets_the_unknown_columns(tmp_path: Path) -> None:
    path = tmp_path / "usage.db"
    old = sqlite3.connect(path)
    old.execute("""CREATE TABLE usage (
        hour INTEGER NOT NULL, cluster TEXT NOT NULL, node TEXT NOT NULL, gpu INTEGER NOT NULL,
        owner TEXT NOT NULL, team TEXT NOT NULL, model TEXT NOT NULL DEFAULT '',
        busy_s REAL NOT NULL DEFAULT 0, held_s REAL NOT NULL DEFAULT 0, free_s REAL NOT NULL DEFAULT 0,
        util_s REAL NOT NULL DEFAULT 0, util_known_s REAL NOT NULL DEFAULT 0,
        busy_kwh REAL NOT NULL DEFAULT 0, held_kwh REAL NOT NULL DEFAULT 0, free_kwh REAL NOT NULL DEFAULT 0,
        PRIMARY KEY (hour, cluster, node, gpu, owner, team)) WITHOUT ROWID""")
    old.execute("INSERT INTO usage (hour, cluster, node, gpu, owner, team, busy_s) "
                "VALUES (0, 'c', 'n', 0, 'a', '', 60)")
    old.commit()
    old.close()
    with UsageStore(path) as store:
        rows = store.usage(0, 3600)
    assert [(r.busy_s, r.unknown_s) for r in rows] == [(60.0, 0.0)]
