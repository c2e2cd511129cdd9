"""The heatmap over time: cells from the rollups (utilization, held-idle share, owner, cost), rows most wasteful
first, per GPU or per node, searched; `GET /api/timeline`."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpuevents.config import CostsConfig, GpuCost
from gpuevents.costs import CostModel
from rules.dashboard.fleet_view import FleetView
from rules.dashboard.pages import make_dashboard_app
from rules.dashboard.timeline import hour_window, timeline
from rules.dashboard.usage_source import UsageSource
from rules.usage.rollup import HOUR, UsageAmounts, UsageBatch, UsageKey
from rules.usage.store import UsageRow, UsageStore

NOW = datetime(2026, 1, 5, 9, 30, tzinfo=UTC)
FIRST, END = hour_window(NOW, 24)
LAST = END - HOUR  # the current hour's bucket
# an H100 costs 1 an hour; energy is free
COSTS = CostModel(CostsConfig(energy_price_kwh=0, models={"H100": GpuCost(price=8760, depreciation_years=1)}))


def row(node: str, gpu: int, owner: str, *, hour: int = LAST, busy: float = 0, held: float = 0, free: float = 0,
        util: float = 0, team: str = "vision", cluster: str = "c1") -> UsageRow:
    return UsageRow(hour, cluster, node, gpu, owner, team, "NVIDIA H100", busy * 60, held * 60, free * 60,
                    util * busy * 60, (busy + held + free) * 60, 0, 0, 0)


ROWS = [
    row("n1", 0, "alice", busy=15, held=45, util=48),  # 12 % over the hour, three quarters held idle
    row("n1", 1, "bob", busy=60, util=90),
    row("n2", 0, "carol", held=20, team="nlp"), row("n2", 0, "dave", busy=40, util=50, team="nlp"),
    row("n2", 0, "carol", hour=FIRST, held=60, team="nlp"),
    row("n1", 0, "alice", hour=FIRST - HOUR, held=60),  # before the window: not shown
]


def test_a_cell_has_utilization_held_share_owner_and_cost() -> None:
    t = timeline(ROWS, COSTS, first=FIRST, hours=24)
    assert t.per == "gpu" and len(t.hours) == 24 and t.hours[-1] == datetime(2026, 1, 5, 9, tzinfo=UTC)
    n1 = next(r for r in t.rows if r.key == "c1/n1/0")
    assert (n1.util[-1], n1.held[-1], n1.cost[-1], n1.held_cost[-1]) == (12.0, 0.75, 1.0, 0.75)
    assert t.owners[n1.owner[-1]] == "alice"
    assert n1.util[0] is None and n1.owner[0] == -1 and n1.held_h == 0.75
    n2 = next(r for r in t.rows if r.key == "c1/n2/0")
    assert t.owners[n2.owner[-1]] == "dave"  # dave had it 40 minutes of the hour, carol 20
    assert n2.held[-1] == pytest.approx(1 / 3, abs=0.001) and n2.team == "nlp"


def test_rows_come_most_held_idle_cost_first_and_can_be_searched_and_cut() -> None:
    t = timeline(ROWS, COSTS, first=FIRST, hours=24)
    assert [r.key for r in t.rows] == ["c1/n2/0", "c1/n1/0", "c1/n1/1"]
    assert [r.key for r in timeline(ROWS, COSTS, first=FIRST, hours=24, query="BOB").rows] == ["c1/n1/1"]
    assert [r.key for r in timeline(ROWS, COSTS, first=FIRST, hours=24, query="nlp").rows] == ["c1/n2/0"]
    cut = timeline(ROWS, COSTS, first=FIRST, hours=24, limit=1)
    assert (len(cut.rows), cut.total_rows, cut.left_out) == (1, 3, 2)
    assert sorted(cut.owners) == ["carol", "dave"]  # only the owners the rows shown name


def test_per_node_adds_the_gpus_of_a_node_up() -> None:
    t = timeline(ROWS, COSTS, first=FIRST, hours=24, per="node")
    n1 = next(r for r in t.rows if r.key == "c1/n1")
    assert (n1.gpu, n1.gpus, n1.label) == (None, 2, "n1")
    assert n1.util[-1] == pytest.approx((48 * 15 + 90 * 60) / 120)
    assert n1.held[-1] == pytest.approx(45 / 120) and n1.cost[-1] == 2.0


def _store(path: Path) -> None:
    batch = UsageBatch(usage=[(UsageKey(r.hour, r.cluster, r.node, r.gpu, r.owner, r.team),
                               UsageAmounts(model=r.model, busy_s=r.busy_s, held_s=r.held_s, free_s=r.free_s,
                                            util_s=r.util_s, util_known_s=r.util_known_s)) for r in ROWS])
    with UsageStore(path) as store:
        store.add(batch)


class _NoFleet:
    def fleet(self) -> FleetView:
        return FleetView(time=NOW)

    def incidents(self) -> list[object]:
        return []

    def recent_audit(self, limit: int) -> list[object]:
        return []


async def test_api_timeline_reads_the_store_and_checks_its_parameters(tmp_path: Path) -> None:
    _store(tmp_path / "u.sqlite")
    usage = UsageSource(tmp_path / "u.sqlite", COSTS, now=lambda: NOW)
    async with TestClient(TestServer(make_dashboard_app(_NoFleet(), usage))) as c:  # type: ignore[arg-type]  # a minimal FleetSource
        r = await c.get("/api/timeline?hours=24&q=alice")
        assert r.status == 200
        body = await r.json()
        assert [x["key"] for x in body["rows"]] == ["c1/n1/0"] and body["rows"][0]["held"][-1] == 0.75
        for bad, says in (("hours=0", "hours must be a whole number from 1 to 168"), ("per=rack", "per must be"),
                          ("limit=x", "limit must be")):
            r = await c.get(f"/api/timeline?{bad}")
            assert r.status == 400 and says in await r.text()
    missing = UsageSource(tmp_path / "none.sqlite", COSTS, now=lambda: NOW)
    assert (await missing.timeline(24)).rows == []
    assert not (tmp_path / "none.sqlite").exists()  # reading never creates the file
    async with TestClient(TestServer(make_dashboard_app(_NoFleet()))) as c:  # type: ignore[arg-type]  # a minimal FleetSource
        r = await c.get("/api/timeline")
        assert r.status == 404 and "no usage history" in await r.text()
