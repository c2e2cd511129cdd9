"""Energy in the weekly report: each team's kWh and cost, and what power caps saved (from the snapshots'
`power_cap_saved_w` while a GPU is capped)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuevents.config import CostsConfig
from gpuevents.costs import CostModel
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, SnapshotEvent, make_event
from rules.usage.render import render_html, render_markdown
from rules.usage.rollup import TeamResolver, UsageAggregator
from rules.usage.store import UsageStore
from rules.usage.weekly import build_report

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
COSTS = CostModel(CostsConfig.model_validate({"energy_price_kwh": 0.5}))


def snap(at: datetime, capped: bool) -> SnapshotEvent:
    p = ProcessInfo(node="n1", pid=10, user="alice", create_time=T0 - timedelta(hours=1), gpus=[0])
    gpus = [GpuInfo(node="n1", index=0, model="H100", util_pct=0, idle=True, idle_since=T0, pids=[10],
                    owners=["alice"], power_w=60.0 if capped else 150.0,
                    power_cap_w=200.0 if capped else None, power_cap_saved_w=90.0 if capped else None),
            GpuInfo(node="n1", index=1, model="H100", util_pct=0, idle=True, idle_since=T0, power_w=70.0)]
    data = NodeSnapshot(node=NodeInfo(name="n1", cluster="c", labels={}), gpus=gpus, processes=[p], jobs=[])
    return make_event("node.snapshot", "n1", data, cluster="c", time=at)


def test_the_report_shows_kwh_saved_by_caps_and_energy_per_team() -> None:
    agg = UsageAggregator(snapshot_interval=60.0, teams=TeamResolver(teams={"alice": "vision"}))
    t = T0
    while t < T0 + timedelta(hours=3):  # an hour uncapped, then two capped
        agg.observe(snap(t, capped=t >= T0 + timedelta(hours=1)), t)
        t += timedelta(seconds=60)
    agg.settle(T0 + timedelta(hours=3))
    store = UsageStore(":memory:")
    store.add(agg.drain())
    rows = store.usage(T0.timestamp(), (T0 + timedelta(hours=3)).timestamp())
    report = build_report(rows, [], COSTS, since=T0, until=T0 + timedelta(hours=3), generated_at=T0)
    assert abs(report.fleet.cap_saved_kwh - 0.18) < 1e-6  # 90 W for two hours
    assert abs(report.fleet.cap_saved_cost - 0.09) < 1e-6
    teams = {t.team: t for t in report.teams}
    # vision: alice's GPU, 150 W for an hour then 60 W for two; no team: the free GPU, 70 W for three hours
    assert abs(teams["vision"].energy_kwh - 0.27) < 1e-6 and abs(teams["vision"].energy_cost - 0.135) < 1e-6
    assert abs(teams[""].energy_kwh - 0.21) < 1e-6
    md = render_markdown(report, COSTS)
    assert "Saved by power caps: 0.2 kWh ($0.09)" in md
    assert "| vision | 0.3 | $0.14 |" in md
    assert 'id="cap-saved"' in render_html(report, COSTS)
