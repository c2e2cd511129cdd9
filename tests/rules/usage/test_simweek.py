"""The simulated past: a working week's rhythm, every kind of waste, and fewer of them lately."""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from rules.usage.rollup import TeamResolver, UsageAggregator, UsageBatch
from rules.usage.simweek import TEAM_OF, HistoryPlan, count_history, drop_recorded, gpu_timeline, history_span

NOW = datetime(2026, 1, 14, 10, 30, tzinfo=UTC)


def _plan(seed: int = 1, days: int = 14) -> HistoryPlan:
    start, end = history_span(NOW, days * 86400)
    return HistoryPlan(nodes=("a", "b"), gpus_per_node=8, start=start, end=end, seed=seed, timezone="Asia/Shanghai")


def test_the_span_ends_where_the_engine_starts_counting() -> None:
    start, end = history_span(NOW, 7 * 86400)
    assert end == datetime(2026, 1, 14, 10, tzinfo=UTC)
    assert (end - start).days == 7


def test_timelines_hold_every_kind_of_job_and_start_more_in_working_hours() -> None:
    plan = _plan()
    tz = ZoneInfo(plan.timezone)
    segments = [s for n in plan.nodes for g in range(plan.gpus_per_node) for s in gpu_timeline(plan, n, g)]
    assert {s.kind for s in segments} == {"training", "stall", "notebook", "allocated", "inference"}
    assert all(s.job for s in segments if s.kind == "allocated")
    local = [datetime.fromtimestamp(s.start, tz) for s in segments if s.kind != "stall"]
    starts = Counter("work" if t.weekday() < 5 and 9 <= t.hour < 19 else "off" for t in local)
    # working hours are 50 of the week's 168: per hour, jobs start there more than half as often again
    assert starts["work"] / 50 > 1.5 * starts["off"] / 118
    assert gpu_timeline(plan, "a", 3) == gpu_timeline(plan, "a", 3)  # the same seed, the same past


def _counted(plan: HistoryPlan) -> UsageBatch:
    return count_history(plan, UsageAggregator(snapshot_interval=plan.step_s, teams=TeamResolver(teams=TEAM_OF)))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_gpu_hour_is_counted_and_the_last_week_wastes_less(seed: int) -> None:
    plan = _plan(seed)
    batch = _counted(plan)
    total_h = sum(a.busy_s + a.held_s + a.free_s for _, a in batch.usage) / 3600
    assert total_h == pytest.approx(14 * 24 * 16)
    mid = plan.end.timestamp() - 7 * 86400
    held: defaultdict[str, float] = defaultdict(float)
    for k, a in batch.usage:
        held["new" if k.hour >= mid else "old"] += a.held_s
    assert held["new"] < 0.9 * held["old"]
    assert {k.team for k, a in batch.usage if a.held_s} == {"vision", "nlp", "speech"}
    assert any(k.job.startswith("job:") for k, _ in batch.idle_jobs)


def test_recorded_node_hours_are_left_alone() -> None:
    plan = _plan(days=1)
    batch = _counted(plan)
    first = min(k.hour for k, _ in batch.usage)
    kept = drop_recorded(batch, {(first, "default", "a")})
    assert {(k.hour, k.node) for k, _ in kept.usage} == {(k.hour, k.node) for k, _ in batch.usage} - {(first, "a")}
    assert all((k.hour, k.node) != (first, "a") for k, _ in kept.idle_jobs)
