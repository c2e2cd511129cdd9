"""`gpuevents import --from prometheus`: dcgm-exporter's past, chunk by chunk, counted into the usage store by the
same aggregators that count live snapshots, each chunk one transaction and remembered once done."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from gpuevents.config import Config
from gpuevents.costs import CostModel
from gpuevents.events import SnapshotEvent
from rules.history.chunklog import ChunkLog
from rules.history.dcgm import METRICS, REQUIRED, Classify, Grid, Rebuilder, grid, kube_label, pod_labels
from rules.history.promapi import PromClient, Series
from rules.usage.fits import FitAggregator
from rules.usage.jobledger import JobLedger, JobTally
from rules.usage.jobstore import JobStore
from rules.usage.rollup import HOUR, TeamResolver, UsageAggregator
from rules.usage.store import UsageStore


@dataclass(frozen=True)
class PromImport:
    """What to import: [since, until) of `url`'s dcgm-exporter series matching `selector` (PromQL label matchers,
    e.g. `cluster="a"`), read every `step_s`, `chunk_s` at a time (whole hours)."""

    url: str
    since: datetime
    until: datetime
    step_s: float = 60.0
    chunk_s: float = 6 * 3600.0
    selector: str = ""
    again: bool = False
    """Import the chunks done before again (the result is the same store, unless the source changed)."""
    mem_floor_mib: float = 256.0
    """An idle GPU with more memory in use than this is held (a process keeps it), at most this is free."""

    @property
    def source(self) -> str:
        """What the chunks done are remembered by, with the cluster: not the URL (a Prometheus and the Thanos in
        front of it hold the same series)."""
        return f"prometheus {{{self.selector}}} step={self.step_s:g}"


@dataclass
class Outcome:
    """What an import covered and what it left out: its last words."""

    chunks: int = 0
    done_before: int = 0
    empty: int = 0
    hours: int = 0
    live: int = 0
    folded_days: int = 0
    jobs: int = 0
    nodes: set[str] = field(default_factory=set)
    gpus: set[tuple[str, int]] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)
    retried: int = 0

    def lines(self, plan: PromImport) -> list[str]:
        span = f"{plan.since:%Y-%m-%d %H:%M} to {plan.until:%Y-%m-%d %H:%M} UTC"
        out = [f"imported {self.hours} node-hours of {len(self.gpus)} GPUs on {len(self.nodes)} nodes from {span} "
               f"({self.chunks} chunks read, {self.jobs} pods as jobs); marked imported, not simulated"]
        left = []
        if self.done_before:
            left.append(f"{self.done_before} chunks imported before (--again reads them again)")
        if self.live:
            left.append(f"{self.live} node-hours the engine recorded live (live wins)")
        if self.folded_days:
            left.append(f"{self.folded_days} days already folded into daily totals")
        if self.empty:
            left.append(f"{self.empty} chunks with no dcgm-exporter series")
        missing = [METRICS[m] for m in METRICS if m not in self.seen]
        if self.jobs and POD_LABELS not in self.seen:
            left.append("no kube_pod_labels (kube-state-metrics): pods' owners and teams are their namespaces")
        if missing:
            left.append(f"series absent, not imported: {', '.join(missing)}")
        if self.retried:
            left.append(f"({self.retried} requests retried after an error or timeout)")
        if left:
            out.append("left out: " + "; ".join(left))
        return out


def chunks(since: datetime, until: datetime, chunk_s: float) -> list[tuple[int, int]]:
    """Whole hours from `since` (rounded down) to `until` (rounded down), `chunk_s` (a whole number of hours) each."""
    first = int(since.timestamp()) // HOUR * HOUR
    last = int(until.timestamp()) // HOUR * HOUR
    size = max(HOUR, int(chunk_s) // HOUR * HOUR)
    return [(a, min(a + size, last)) for a in range(first, last, size)]


def read_chunk(client: PromClient, plan: PromImport, start: int, end: int, how: Classify) -> tuple[Grid, set[str]]:
    """Every metric's series over [start, end), as readings by step; and the metrics that had any. The pods' labels
    of the chunk (kube-state-metrics' `kube_pod_labels`, where Prometheus has it) go to `how`, for owners and
    teams."""
    found: dict[str, list[Series]] = {}
    for name, metric in METRICS.items():
        series = client.query_range(f"{metric}{{{plan.selector}}}", start, end - plan.step_s / 2, plan.step_s)
        if series:
            found[name] = series
    seen = set(found)
    if any(_label_of_pod(s) for name in found for s in found[name]):
        labels = client.labels_at(f"last_over_time(kube_pod_labels{{{plan.selector}}}[{end - start}s])", end)
        how.pod_labels.clear()
        how.pod_labels.update(pod_labels(labels))
        if labels:
            seen.add(POD_LABELS)
    return grid(found), seen


POD_LABELS = "kube_pod_labels"


def _label_of_pod(s: Series) -> bool:
    return bool(s.labels.get("exported_pod") or s.labels.get("pod"))


def rebuilder(config: Config, plan: PromImport) -> Rebuilder:
    """Readings judged as the engine judges live ones: the config's idle rule per model, `owners` for a pod's
    namespace."""
    a = config.agent.attribution
    how = Classify(idle_rule=config.agent.thresholds.idle_rule, mem_floor_mib=plan.mem_floor_mib,
                   owners=config.owners, owner_label=kube_label(a.owner_pod_label) if a.owner_pod_label else None,
                   team_label=kube_label(a.team_pod_label or config.costs.team_label))
    return Rebuilder(config.cluster, how)


def rebuilt_events(config: Config, client: PromClient, plan: PromImport) -> Iterator[SnapshotEvent]:
    """The node snapshots the series give, chunk by chunk in time order: what `rules backtest --prometheus`
    replays (readings rebuilt from the series, with no processes: what dcgm-exporter does not see)."""
    rebuild = rebuilder(config, plan)
    for start, end in chunks(plan.since, plan.until, plan.chunk_s):
        readings, _seen = read_chunk(client, plan, start, end, rebuild.how)
        yield from rebuild.events(readings)


def import_prometheus(config: Config, client: PromClient, plan: PromImport, now: datetime,
                      progress: Callable[[int, int], None] | None = None) -> Outcome:
    """Import `plan` into `engine.usage_db`; PromError (after the chunks done so far are stored) when Prometheus
    fails beyond its retries: the same command goes on from there."""
    costs = CostModel(config.costs)
    teams: dict[str, str] = {}  # owner -> team: a pod's team label, else its namespace, as it is read
    resolver = TeamResolver(team_label=config.costs.team_label, owners=config.owners, teams=teams)
    rebuild = rebuilder(config, plan)
    ledger = JobLedger(max_gap_s=3 * plan.step_s)
    out = Outcome()
    todo = chunks(plan.since, plan.until, plan.chunk_s)
    db = config.engine.usage_db
    with UsageStore(db) as store, JobStore(db) as jobs, ChunkLog(db) as log:
        done = set() if plan.again else log.done(plan.source, config.cluster)
        for i, (start, end) in enumerate(todo):
            if progress is not None:
                progress(i, len(todo))
            if (start, end) in done:
                out.done_before += 1
                continue
            readings, seen = read_chunk(client, plan, start, end, rebuild.how)
            out.chunks += 1
            out.seen |= seen
            if not readings or not set(REQUIRED) & seen:
                out.empty += 1
            usage = UsageAggregator(snapshot_interval=plan.step_s, gap_intervals=1.0, teams=resolver,
                                    rated_power_w=lambda model: costs.gpu_cost(model).rated_power_w)
            fits = FitAggregator(snapshot_interval=plan.step_s, gap_intervals=1.0, teams=resolver)
            for event in rebuild.events(readings):
                for j in event.data.jobs:
                    if j.owner and (j.labels.get("team") or j.namespace):
                        teams.setdefault(j.owner, j.labels.get("team") or j.namespace or "")
                usage.observe(event, event.time)
                fits.observe(event, event.time)
                ledger.observe(event)
                out.nodes.add(event.node)
                out.gpus.update((event.node, g.index) for g in event.data.gpus)
            usage.settle(datetime.fromtimestamp(end, UTC))
            wrote = store.replace_imported(usage.drain(), fits.drain(), config.cluster, start, end)
            out.hours += wrote.hours
            out.live += wrote.live
            out.folded_days += wrote.folded_days
            out.jobs += _write_jobs(jobs, ledger.drain(datetime.fromtimestamp(end, UTC)), costs)
            log.mark(plan.source, config.cluster, start, end, now.timestamp())
        last = plan.until + timedelta(seconds=3 * plan.step_s + 1)
        out.jobs += _write_jobs(jobs, ledger.drain(last), costs)
    if progress is not None:
        progress(len(todo), len(todo))
    out.retried = client.retried
    return out


def _write_jobs(jobs: JobStore, tallies: list[JobTally], costs: CostModel) -> int:
    ended = [t for t in tallies if t.ended_at is not None]
    for t in ended:
        t.imported = True
    return jobs.put_imported(ended, costs) if ended else 0
