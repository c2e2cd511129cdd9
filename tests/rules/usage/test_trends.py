"""Week over week per team and the owners' leaderboard, against numbers worked out by hand."""

from __future__ import annotations

import pytest

from gpuevents.config import CostsConfig, GpuCost
from gpuevents.costs import CostModel
from rules.usage.store import UsageRow
from rules.usage.trends import leaderboard, week_over_week

# an H100 costs 24 a day, 1 an hour; energy is free: money = GPU-hours
COSTS = CostModel(CostsConfig(energy_price_kwh=0, models={"H100": GpuCost(price=8760, depreciation_years=1)}))
H = 3600


def row(team: str, owner: str, *, busy_h: float = 0, held_h: float = 0, free_h: float = 0, util: float = 0,
        hour: int = 0, gpu: int = 0) -> UsageRow:
    known = (busy_h + held_h + free_h) * H
    return UsageRow(hour, "c", "n1", gpu, owner, team, "NVIDIA H100", busy_h * H, held_h * H, free_h * H,
                    util * busy_h * H, known, 0, 0, 0)


def test_week_over_week_gives_each_team_its_change_in_utilization_and_waste() -> None:
    before = [row("vision", "alice", busy_h=2, util=50), row("vision", "alice", held_h=2, hour=H),
              row("vision", "", free_h=4, hour=2 * H), row("nlp", "bob", busy_h=5, util=90)]
    now = [row("vision", "alice", busy_h=3, util=80), row("vision", "alice", held_h=1, hour=H),
           row("vision", "", free_h=1, hour=2 * H), row("speech", "carol", held_h=3)]
    wow = week_over_week(now, before, COSTS, ["vision", "speech", "nlp"])
    vision, speech, nlp = wow.teams
    assert (vision.prev_util_pct, vision.util_pct, vision.util_change_pts) == (25.0, 60.0, 35.0)
    assert (vision.prev_busy_share_pct, vision.busy_share_pct, vision.busy_share_change_pts) == (50.0, 75.0, 25.0)
    assert (vision.prev_held_idle_h, vision.held_idle_h, vision.held_idle_change_pct) == (2.0, 1.0, -50.0)
    assert (vision.prev_waste_cost, vision.waste_cost) == pytest.approx((6.0, 2.0))  # held + free hours
    assert vision.waste_change_pct == pytest.approx(-100 * 4 / 6)
    assert (speech.prev_util_pct, speech.util_change_pts, speech.waste_change_pct) == (None, None, None)  # new
    assert (nlp.util_pct, nlp.prev_util_pct, nlp.held_idle_h, nlp.prev_held_idle_h) == (None, 90.0, 0.0, 0.0)
    assert wow.fleet.prev_waste_cost == pytest.approx(6.0) and wow.fleet.waste_cost == pytest.approx(5.0)


def test_leaderboard_ranks_owners_by_the_money_they_held_idle_across_teams() -> None:
    rows = [row("vision", "alice", held_h=2), row("nlp", "alice", held_h=1, gpu=1, busy_h=3, util=90),
            row("nlp", "bob", held_h=5), row("nlp", "carol", busy_h=8, util=95), row("nlp", "", free_h=9)]
    board = leaderboard(rows, COSTS)
    assert [(o.rank, o.owner, o.teams) for o in board] == [(1, "bob", ["nlp"]), (2, "alice", ["nlp", "vision"])]
    alice = board[1]
    assert (alice.held_idle_h, alice.held_idle_cost, alice.busy_h) == pytest.approx((3.0, 3.0, 3.0))
    assert alice.busy_share_pct == pytest.approx(50.0)
    assert leaderboard(rows, COSTS, limit=1)[0].owner == "bob"
