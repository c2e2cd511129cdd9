"""The engine's side of rollups: feed snapshots in, write hourly buckets to SQLite now and then."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import ParamSpec, TypeVar

from gpuevents.config import Config
from gpuevents.costs import CostModel
from gpuevents.events import SnapshotEvent
from rules.usage.fits import FitAggregator, FitAmounts, FitKey
from rules.usage.jobledger import JobLedger
from rules.usage.jobstore import JobStore, JobSummary, summary_of
from rules.usage.keeps import KeepRow, KeepStore
from rules.usage.rollup import TeamResolver, UsageAggregator, UsageBatch
from rules.usage.store import UsageStore

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

PRUNE_EVERY_S = 3600.0
FITS_RETENTION_S = 92 * 86400.0  # right-sizing looks back a quarter at most


@dataclass(frozen=True, slots=True)
class WasteDelta:
    """Money newly counted as wasted by one flush; the engine adds it to `gpuevents_waste_cost_total`."""

    held_idle: float = 0.0
    unallocated: float = 0.0


def waste_of(batch: UsageBatch, costs: CostModel) -> WasteDelta:
    """What the idle GPU-hours in `batch` cost: depreciation for the time plus the energy drawn."""
    held = free = 0.0
    for _key, a in batch.usage:
        capital_per_s = costs.capital_daily(a.model or None) / 86400
        held += capital_per_s * a.held_s + costs.energy_cost(a.held_kwh)
        free += capital_per_s * a.free_s + costs.energy_cost(a.free_kwh)
    return WasteDelta(held_idle=held, unallocated=free)


class UsageRecorder:
    """Aggregates in memory (`observe`, cheap, no I/O); `flush` writes and prunes in a worker thread.

    The aggregator is touched only on the event loop: `flush` settles and drains it there (pure and
    fast) and hands the worker thread a batch that nothing else refers to, so snapshots observed
    while a write is in flight land in the next batch. A crash loses at most what came since the
    last flush; the engine flushes on its tick.

    Every write runs in a worker thread under one lock, which `close` takes too: a flush cancelled while its
    thread writes (the engine stopping) leaves the thread running, and closing SQLite under it crashed the
    process. `close` waits for that write to end; a thread started after it gets SQLite's "closed database".
    """

    def __init__(
        self, aggregator: UsageAggregator, store: UsageStore, retention_s: float, costs: CostModel,
        fits: FitAggregator | None = None, hourly_for_s: float | None = None,
        jobs: JobStore | None = None, job_gap_s: float = 600.0, keeps: KeepStore | None = None,
    ) -> None:
        self.aggregator = aggregator
        self.fits = fits
        self.hourly_for_s = hourly_for_s  # hourly buckets older than this are folded into days
        self.costs = costs
        self.store = store
        self.jobs = jobs
        """Job summaries (rules/usage/jobstore.py); a job silent for `job_gap_s` has ended."""
        self.ledger = JobLedger(job_gap_s)
        self.ended: list[JobSummary] = []
        """Summaries of the jobs that ended, for the engine to announce (`job.ended`); it empties the list."""
        if jobs is not None:
            self.ledger.resume(jobs.running())
        self.keeps = keeps
        """Owners' keeps, for the weekly report (rules/usage/keeps.py)."""
        self.retention_s = retention_s
        self._lock = asyncio.Lock()
        self._io = threading.Lock()
        self._pruned_at: float | None = None

    @classmethod
    def from_config(cls, config: Config, teams: Mapping[str, str] | None = None) -> UsageRecorder:
        """`teams` maps an owner or user to a team, for processes and nodes without a team label."""
        costs = CostModel(config.costs)
        resolver = TeamResolver(team_label=config.costs.team_label, owners=config.owners, teams=teams or {})
        aggregator = UsageAggregator(
            snapshot_interval=config.agent.snapshot_interval,
            teams=resolver,
            rated_power_w=lambda model: costs.gpu_cost(model).rated_power_w,
        )
        fits = FitAggregator(snapshot_interval=config.agent.snapshot_interval, teams=resolver)
        return cls(aggregator, UsageStore(config.engine.usage_db), config.engine.usage_retention, costs, fits,
                   config.engine.usage_hourly_for, jobs=JobStore(config.engine.usage_db),
                   keeps=KeepStore(config.engine.usage_db),
                   job_gap_s=max(float(config.engine.offline_grace), 3 * float(config.agent.snapshot_interval)))

    async def record_keep(self, row: KeepRow) -> None:
        """A keep applied (or a snooze lifted: `row.until` <= `row.start`); logged, never raised: the keep stands
        whether or not the report can count it."""
        if self.keeps is None:
            return
        keeps = self.keeps
        try:
            if row.until <= row.start and not row.approved_by:
                await self._in_thread(keeps.lift, row.cluster, row.rule, row.entity_id, row.start)
            else:
                await self._in_thread(keeps.add, row)
        except Exception:
            log.exception("usage store: the keep of %s (%s) could not be recorded for the report", row.entity_id,
                          row.rule)

    async def keeps_taken(self, since: float, by: str, team: str) -> tuple[int, int]:
        """Keeps taken from `since` on by `by` and of `team` (for keep budgets); (0, 0) without a store."""
        if self.keeps is None:
            return 0, 0
        return await self._in_thread(self.keeps.taken_since, since, by, team)

    def observe(self, event: SnapshotEvent, now: datetime) -> None:
        self.aggregator.observe(event, now)
        if self.fits is not None:
            self.fits.observe(event, now)
        self.ledger.observe(event)

    async def flush(self, now: datetime) -> WasteDelta:
        """Count up to `now`, write what was counted, prune past the retention once an hour.

        Returns the waste the written batch adds. If the write fails, the batch goes back into the
        aggregator (it was one transaction, so none of it was stored) and the next flush carries it.
        """
        async with self._lock:
            self.aggregator.settle(now)  # on the loop, like observe(): never both at once
            batch = self.aggregator.drain()
            fits = self.fits.drain() if self.fits is not None else []
            if batch or fits:
                try:
                    await self._in_thread(self._write, batch, fits)
                except Exception:  # not on cancellation: the thread may still write it
                    self.aggregator.restore(batch)
                    if self.fits is not None:
                        self.fits.restore(fits)
                    raise
            await self._write_jobs(now)
            await self._prune(now.timestamp())
            return waste_of(batch, self.costs)

    def _write(self, batch: UsageBatch, fits: list[tuple[FitKey, FitAmounts]]) -> None:
        if batch:
            self.store.add(batch)
        if fits:
            self.store.add_fits(fits)

    async def _write_jobs(self, now: datetime) -> None:
        """The jobs' tallies changed since the last flush; kept for the next one if the write fails."""
        tallies = self.ledger.drain(now)
        self.ended += [summary_of(t, self.costs) for t in tallies if t.ended_at is not None]
        if self.jobs is None or not tallies:
            return
        try:
            await self._in_thread(self.jobs.put, tallies, self.costs)
        except Exception:
            for t in tallies:  # written whole or not at all: write them again next time
                self.ledger.jobs.setdefault(t.key, t)
                self.ledger.dirty.add(t.key)
            raise

    async def _prune(self, t: float) -> None:
        if self._pruned_at is not None and t - self._pruned_at < PRUNE_EVERY_S:
            return
        try:
            removed = await self._in_thread(self.store.prune, t - self.retention_s, t - FITS_RETENTION_S)
            if self.jobs is not None:
                removed += await self._in_thread(self.jobs.prune, t - self.retention_s)
            if self.keeps is not None:
                removed += await self._in_thread(self.keeps.prune, t - self.retention_s)
        except Exception:  # the batch is written; pruning is retried on the next flush
            log.exception("usage rollups: pruning buckets older than the retention failed")
            return
        self._pruned_at = t
        if removed:
            log.info("usage rollups: pruned %d buckets older than the retention", removed)
        if self.hourly_for_s is not None:
            try:
                folded = await self._in_thread(self.store.compact, t - self.hourly_for_s)
            except Exception:
                log.exception("usage rollups: folding old hours into days failed")
                return
            if folded:
                log.info("usage rollups: folded %d hourly buckets into days", folded)

    async def _in_thread(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        def locked() -> R:
            with self._io:
                return fn(*args, **kwargs)

        return await asyncio.to_thread(locked)

    def close(self) -> None:
        """Close the stores once no worker thread is using them (a write ends within SQLite's 10 s timeout)."""
        with self._io:
            self._close()

    def _close(self) -> None:
        self.store.close()
        if self.jobs is not None:
            self.jobs.close()
        if self.keeps is not None:
            self.keeps.close()
