"""`gpuevents simulate --history 7d`: a realistic past of usage written to the rollups store, for first reports."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpuevents.config import Config
from gpuevents.costs import CostModel
from rules.usage.fits import FitAggregator
from rules.usage.jobledger import JobKey, JobTally
from rules.usage.jobstore import JobStore
from rules.usage.rollup import TeamResolver, UsageAggregator
from rules.usage.simweek import TEAM_OF, HistoryPlan, count_history, drop_recorded, history_span
from rules.usage.store import SIMULATED, UsageStore

MAX_HISTORY_S = 100 * 86400  # a quarter's KPI (13 weeks) and a little more


@dataclass(frozen=True)
class HistoryWritten:
    nodes: tuple[str, ...]
    hours: int  # node-hours written
    skipped: int  # node-hours left alone: they had usage already
    jobs: int = 0  # job summaries written (`gpuevents jobs`)


def history_nodes(config: Config, nodes: int) -> tuple[str, ...]:
    """The nodes `gpuevents up` or `gpuevents simulate --nodes N` would run: this node's name for one, else
    `sim-000`, `sim-001`, ..."""
    if nodes == 1:
        return (config.agent.node_name,)
    width = max(3, len(str(nodes - 1)))
    return tuple(f"sim-{i:0{width}d}" for i in range(nodes))


def write_history(config: Config, *, seconds: float, nodes: int, gpus_per_node: int, seed: int,
                  now: datetime) -> HistoryWritten:
    """Simulate `seconds` of usage up to the current hour and add it to `engine.usage_db`, leaving alone every
    node-hour that already has usage (real or simulated), so running it twice adds nothing."""
    if not 0 < seconds <= MAX_HISTORY_S:
        raise ValueError(f"--history must be more than 0s and at most {MAX_HISTORY_S // 86400}d")
    start, end = history_span(now, seconds)
    names = history_nodes(config, nodes)
    plan = HistoryPlan(nodes=names, gpus_per_node=gpus_per_node, start=start, end=end, cluster=config.cluster,
                       seed=seed, timezone=config.engine.timezone)
    costs = CostModel(config.costs)
    aggregator = UsageAggregator(
        snapshot_interval=plan.step_s,
        teams=TeamResolver(team_label=config.costs.team_label, owners=config.owners, teams=TEAM_OF),
        rated_power_w=lambda model: costs.gpu_cost(model).rated_power_w,
    )
    fits = FitAggregator(snapshot_interval=plan.step_s, teams=aggregator.teams)
    tallies: dict[JobKey, JobTally] = {}
    batch = count_history(plan, aggregator, fits, tallies)
    for t in tallies.values():
        t.simulated = True
    with UsageStore(config.engine.usage_db) as store:
        recorded = {r for r in store.recorded_hours(start.timestamp(), end.timestamp()) if r[1] == config.cluster}
        fresh = drop_recorded(batch, recorded)
        store.add(fresh)
        recorded_hours = {h for h, _c, _n in recorded}
        store.add_fits([(k, a) for k, a in fits.drain() if k.hour not in recorded_hours])
        store.mark_origin({(k.hour, k.cluster, k.node) for k, _ in fresh.usage}, SIMULATED)
    with JobStore(config.engine.usage_db) as job_store:
        jobs = job_store.put_new(list(tallies.values()), costs)
    written = {(k.hour, k.node) for k, _ in fresh.usage}
    skipped = {(h, n) for h, _, n in recorded if n in names}
    return HistoryWritten(nodes=names, hours=len(written), skipped=len(skipped), jobs=jobs)
