"""Usage rows added up and priced by hand: GPU-hours by state, the cost of each (depreciation for the time plus
energy), utilization over the known time only, the busy share of held hours; merging sums adds every field."""

from __future__ import annotations

import pytest

from gpuevents.config import CostsConfig, GpuCost
from gpuevents.costs import CostModel
from rules.usage.store import UsageRow
from rules.usage.sums import UsageSum

# 87,600 over one year is 240 a day, 10 an hour; 0.5 a kWh at a PUE of 2 is 1 a kWh.
COSTS = CostModel(CostsConfig(energy_price_kwh=0.5, pue=2, default=GpuCost(price=87_600, depreciation_years=1)))


def row(busy_s: float, held_s: float, free_s: float, util_s: float = 0.0, util_known_s: float = 0.0,
        kwh: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> UsageRow:
    return UsageRow(hour=0, cluster="c1", node="n1", gpu=0, owner="alice", team="ml", model="",
                    busy_s=busy_s, held_s=held_s, free_s=free_s, util_s=util_s, util_known_s=util_known_s,
                    busy_kwh=kwh[0], held_kwh=kwh[1], free_kwh=kwh[2])


def test_hours_and_their_cost_by_state() -> None:
    total = UsageSum()
    total.add(row(1800, 1800, 0, kwh=(0.4, 0.1, 0.0)), COSTS)
    total.add(row(0, 0, 3600, kwh=(0.0, 0.0, 0.05)), COSTS)
    assert (total.busy_h, total.held_h, total.free_h, total.gpu_h) == (0.5, 0.5, 1.0, 2.0)
    assert total.kwh == pytest.approx(0.55)
    assert total.held_cost == pytest.approx(5 + 0.1)
    assert total.free_cost == pytest.approx(10 + 0.05)
    assert total.cost == pytest.approx(20 + 0.55)


def test_utilization_counts_only_the_time_it_was_known() -> None:
    total = UsageSum()
    assert total.util is None and total.busy_share is None
    total.add(row(3600, 0, 0, util_s=1800, util_known_s=2400), COSTS)
    assert total.util == pytest.approx(0.75)


def test_the_busy_share_is_of_the_hours_somebody_held() -> None:
    total = UsageSum()
    total.add(row(900, 2700, 7200), COSTS)
    assert total.busy_share == pytest.approx(25.0)


def test_merge_adds_every_field() -> None:
    a, b = UsageSum(), UsageSum()
    a.add(row(3600, 0, 0, util_s=3600, util_known_s=3600, kwh=(0.7, 0, 0)), COSTS)
    b.add(row(0, 3600, 0, kwh=(0, 0.1, 0)), COSTS)
    merged = UsageSum()
    merged.merge(a)
    merged.merge(b)
    assert (merged.busy_h, merged.held_h, merged.util_s, merged.util_known_s) == (1.0, 1.0, 3600, 3600)
    assert merged.cost == pytest.approx(a.cost + b.cost) and merged.held_cost == pytest.approx(b.held_cost)
    assert merged.busy_share == pytest.approx(50.0)
