"""The usage store: fit rows round-trip, old hours fold into days with every total kept;
a deleted or replaced file is noticed, said in the log, and written again; per-week sums give the same quarter as
every hour does."""

from __future__ import annotations

import logging
import os
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuevents.config import CostsConfig, GpuCost
from gpuevents.costs import CostModel
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, SnapshotEvent, make_event
from rules.usage.fits import FitAmounts, FitKey
from rules.usage.quarter import build_quarter
from rules.usage.rollup import IdleJobAmounts, IdleJobKey, UsageAggregator, UsageAmounts, UsageBatch, UsageKey
from rules.usage.store import UsageStore
from tests.rules.dashboard.fleetday import DAY_START

DAY = 86400
T = 20_000 * DAY  # a UTC midnight


def _batch(days: int) -> UsageBatch:
    usage = [(UsageKey(T + h * 3600, "c", "n1", g, "alice", "nlp"),
              UsageAmounts(model="H100", busy_s=1800, held_s=1200, free_s=600, util_s=90_000, util_known_s=3000,
                           busy_kwh=0.2, held_kwh=0.05, free_kwh=0.01))
             for h in range(days * 24) for g in range(8)]
    jobs = [(IdleJobKey(T + h * 3600, "c", "n1", 0, "job:7"), IdleJobAmounts(name="job 7", owner="alice", team="nlp",
                                                                            held_s=1200, held_kwh=0.05))
            for h in range(days * 24)]
    return UsageBatch(usage=usage, idle_jobs=jobs)


def test_old_hours_fold_into_days_and_every_total_is_kept(tmp_path: Path) -> None:
    with UsageStore(tmp_path / "u.sqlite") as store:
        store.add(_batch(10))
        fit = FitAmounts(owner="alice", team="nlp", model="H100", gpus=2, held_s=3600, peak_mem_mib=5000,
                         mem_total_mib=81559, util_hist=[3600.0] + [0.0] * 19, sm_hist=[0.0] * 20)
        store.add_fits([(FitKey(T + h * 3600, "c", "job/slurm/7"), fit) for h in range(10 * 24)])
        before = store.usage(0, 1e12)
        fits_before = store.fits(0, 1e12)
        folded = store.compact(T + 7 * DAY)  # the first seven days become days
        after = store.usage(0, 1e12)
        assert folded == 7 * 24 * 8
        assert len(after) == 7 + 3 * 24 * 8  # one row a day for the old week, hours for the last three days
        for field in ("busy_s", "held_s", "free_s", "util_s", "busy_kwh"):
            assert sum(getattr(r, field) for r in after) == pytest.approx(sum(getattr(r, field) for r in before))
        assert {r.gpu for r in after if r.hour < T + 7 * DAY} == {-1}
        assert sum(j.held_s for j in store.idle_jobs(0, 1e12)) == pytest.approx(10 * 24 * 1200)
        fits_after = store.fits(0, 1e12)
        assert len(fits_after) == 7 + 3 * 24
        assert sum(a.held_s for _, a in fits_after) == pytest.approx(sum(a.held_s for _, a in fits_before))
        assert sum(sum(a.util_hist) for _, a in fits_after) == pytest.approx(10 * 24 * 3600)
        assert max(a.gpus for _, a in fits_after) == 2 and max(a.peak_mem_mib for _, a in fits_after) == 5000
        assert store.compact(T + 7 * DAY) == 0  # folding again changes nothing


def batch(node: str, seconds: float = 10) -> UsageBatch:
    """`seconds` of one busy GPU on `node`."""
    agg = UsageAggregator(snapshot_interval=15, rated_power_w=lambda _m: 400.0)
    snap = NodeSnapshot(node=NodeInfo(name=node), gpus=[GpuInfo(node=node, index=0, util_pct=50)])
    event: SnapshotEvent = make_event("node.snapshot", node, snap, time=DAY_START)
    agg.observe(event, event.time)
    agg.settle(DAY_START + timedelta(seconds=seconds))
    return agg.drain()


def nodes_in(path: Path) -> dict[str, float]:
    """Busy seconds per node, as a report reading the file at `path` sees them."""
    with UsageStore(path) as reader:
        return {r.node: r.busy_s for r in reader.usage(0, 2**40)}


def test_a_deleted_database_is_created_again_written_and_logged(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "usage.sqlite"
    with UsageStore(path) as store:
        store.add(batch("before"))
        os.unlink(path)
        store.add(batch("after"))
        assert path.exists()
        assert nodes_in(path) == {"after": pytest.approx(10)}  # not into the unlinked file any more
    (line,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert f"the usage database {path} was deleted: a new, empty one is created" in line.getMessage()


def test_a_replaced_database_is_used_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, restored = tmp_path / "usage.sqlite", tmp_path / "restored.sqlite"
    with UsageStore(restored) as backup:
        backup.add(batch("from-backup"))
    with UsageStore(path) as store:
        store.add(batch("old"))
        os.replace(restored, path)  # an operator restores a backup under the same name
        store.add(batch("new"))
        assert {r.node for r in store.usage(0, 2**40)} == {"from-backup", "new"}
    assert set(nodes_in(path)) == {"from-backup", "new"}
    assert any("was replaced: the new file is used" in r.getMessage() for r in caplog.records)


def test_an_untouched_database_is_not_reopened(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "usage.sqlite"
    with UsageStore(path) as store:
        store.add(batch("a"))
        store.add(batch("b"))
        store.prune(0)
    assert set(nodes_in(path)) == {"a", "b"} and not caplog.records


_ROW = st.tuples(st.integers(0, 13 * 7 * 24 - 1), st.sampled_from(["n1", "n2"]), st.integers(0, 1),
                 st.sampled_from(["", "alice", "bob"]), st.sampled_from(["", "nlp", "vision"]),
                 st.sampled_from(["H100", "A100"]), st.floats(0, 3600), st.floats(0, 100))


@settings(max_examples=30, deadline=None)
@given(st.lists(_ROW, min_size=1, max_size=60, unique_by=lambda r: r[:5]))
def test_week_sums_give_the_quarter_that_every_hour_gives(rows: list[tuple[int, str, int, str, str, str, float,
                                                                          float]]) -> None:
    """The quarter's KPI read from per-week sums in SQLite equals the one read from every hourly row."""
    costs = CostModel(CostsConfig(models={"H100": GpuCost(price=30000, depreciation_years=4, rated_power_w=700),
                                          "A100": GpuCost(price=15000, depreciation_years=4, rated_power_w=400)}))
    since = T + 3 * 3600 + 0.25  # weeks need not start at midnight, nor on a whole second (`report` starts at now)
    batch = UsageBatch(usage=[
        (UsageKey(int(since) + 1 + h * 3600, "c", node, gpu, owner, team),
         UsageAmounts(model=model, busy_s=busy if owner else 0, held_s=(3600 - busy) if owner else 0,
                      free_s=0 if owner else 3600, util_s=util * 3600 if owner else 0,
                      util_known_s=3600 if owner else 0, busy_kwh=busy / 3600, held_kwh=0.1))
        for h, node, gpu, owner, team, model, busy, util in rows])
    with tempfile.TemporaryDirectory() as tmp, UsageStore(Path(tmp) / "u.sqlite") as store:
        store.add(batch)
        start, end = datetime.fromtimestamp(since, UTC), datetime.fromtimestamp(since + 13 * 7 * DAY, UTC)
        targets = {"nlp": 60.0}
        every = build_quarter(store.usage(since, end.timestamp()), costs, start, end, targets)
        summed = build_quarter(store.week_sums(since, end.timestamp()), costs, start, end, targets)
        assert len(store.week_sums(since, end.timestamp())) <= 13 * 3 * 2 * 2  # weeks × teams × models × held
    assert [s.team for s in summed.teams] == [s.team for s in every.teams]
    for a, b in zip([summed.fleet, *summed.teams], [every.fleet, *every.teams], strict=True):
        for p, q in zip(a.points, b.points, strict=True):
            assert (p.util_pct is None) == (q.util_pct is None)
            assert p.util_pct == pytest.approx(q.util_pct, abs=1e-6) if q.util_pct is not None else True
            assert (p.held_idle_h, p.held_idle_cost, p.gpu_h) == pytest.approx((q.held_idle_h, q.held_idle_cost,
                                                                                q.gpu_h), abs=1e-6)
