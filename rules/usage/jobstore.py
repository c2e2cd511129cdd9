"""Job summaries in the usage store: one row per job (running ones updated as they go, ended ones kept), and
the summary a user reads (`gpuevents job ID`, `gpuevents jobs`)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from gpuevents.costs import CostModel
from gpuevents.events import SCHEDULER_SOURCE, JobEnded, JobEndedEvent, make_event
from rules.usage.fits import mem_edge, pct_edge, sparse_percentile
from rules.usage.jobledger import JobTally
from rules.usage.rightsize import WorkloadUse, advise

_SCHEMA = """
CREATE TABLE IF NOT EXISTS job_summaries (
    cluster TEXT NOT NULL, scheduler TEXT NOT NULL, id TEXT NOT NULL,
    user TEXT, name TEXT, account TEXT, partition TEXT, qos TEXT, namespace TEXT, model TEXT,
    nodes TEXT NOT NULL DEFAULT '[]', gpu_count INTEGER NOT NULL DEFAULT 0,
    started_at REAL, first_seen REAL NOT NULL, last_seen REAL NOT NULL, ended_at REAL,
    gpu_s REAL NOT NULL DEFAULT 0, util_s REAL NOT NULL DEFAULT 0, util_known_s REAL NOT NULL DEFAULT 0,
    util_peak REAL, sm_s REAL NOT NULL DEFAULT 0, sm_known_s REAL NOT NULL DEFAULT 0, mem_peak_mib REAL,
    idle_gpu_s REAL NOT NULL DEFAULT 0, kwh REAL NOT NULL DEFAULT 0, cost REAL NOT NULL DEFAULT 0,
    smaller_fit TEXT, exemption TEXT, exempt_until REAL, util_hist TEXT, sm_hist TEXT, mem_hist TEXT,
    simulated INTEGER NOT NULL DEFAULT 0, imported INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (cluster, scheduler, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS job_summaries_seen ON job_summaries (last_seen);
"""
"""A table of its own, created where missing: a usage store from before it keeps working as it was."""

_COLUMNS = ("cluster", "scheduler", "id", "user", "name", "account", "partition", "qos", "namespace", "model",
            "nodes", "gpu_count", "started_at", "first_seen", "last_seen", "ended_at", "gpu_s", "util_s",
            "util_known_s", "util_peak", "sm_s", "sm_known_s", "mem_peak_mib", "idle_gpu_s", "kwh", "cost",
            "smaller_fit", "exemption", "exempt_until", "util_hist", "sm_hist", "mem_hist", "simulated",
            "imported")
_TIMES = ("started_at", "first_seen", "last_seen", "ended_at", "exempt_until")
_HISTS = ("util_hist", "sm_hist", "mem_hist")  # JSON objects, bin -> GPU-seconds
_ADDED = {"exemption": "TEXT", "exempt_until": "REAL", "util_hist": "TEXT", "sm_hist": "TEXT",
          "mem_hist": "TEXT", "simulated": "INTEGER NOT NULL DEFAULT 0",
          "imported": "INTEGER NOT NULL DEFAULT 0"}  # columns a store from before them gains
_INSERT_NEW = (f"INSERT OR IGNORE INTO job_summaries ({', '.join(_COLUMNS)}) "
               f"VALUES ({', '.join('?' for _ in _COLUMNS)})")
_PUT_IMPORTED = (f"INSERT INTO job_summaries ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' for _ in _COLUMNS)}) "
                 "ON CONFLICT (cluster, scheduler, id) DO UPDATE SET "
                 + ", ".join(f"{c} = excluded.{c}" for c in _COLUMNS[3:]) + " WHERE job_summaries.imported = 1")
_UPSERT = (f"INSERT OR REPLACE INTO job_summaries ({', '.join(_COLUMNS)}) "
           f"VALUES ({', '.join('?' for _ in _COLUMNS)})")


class JobSummary(BaseModel):
    """A job's use of its GPUs, as `gpuevents job ID` shows it; running jobs' figures are so far."""

    model_config = ConfigDict(frozen=True)
    cluster: str
    scheduler: str
    id: str
    user: str | None
    name: str | None
    account: str | None
    partition: str | None
    qos: str | None
    namespace: str | None
    model: str | None
    nodes: list[str]
    gpu_count: int
    started_at: datetime | None
    ended_at: datetime | None
    last_seen: datetime
    running: bool
    hours: float
    gpu_hours: float
    mean_util_pct: float | None
    peak_util_pct: float | None
    mean_sm_active_pct: float | None
    """None where SM activity was not measured (no GPM / DCGM profiling)."""
    peak_mem_mib: float | None
    p95_util_pct: float | None = None
    """Utilization at the 95th percentile of the job's GPU-time: the upper edge of its 5 % bin, at most the peak."""
    p95_sm_active_pct: float | None = None
    """SM activity at its 95th percentile, where measured."""
    p95_mem_mib: float | None = None
    """GPU memory used at its 95th percentile, rounded up to its bin (at most 9 % over), at most the peak."""
    idle_share_pct: float | None
    cost: float
    exemption: str | None = None
    """The annotations that exempted it (`gpuevents.io/keep-until: …`) when last seen, or None."""
    exempt_until: datetime | None = None
    simulated: bool = False
    """Written by `gpuevents simulate --history`: not a real job."""
    imported: bool = False
    """Written by `gpuevents import` from the site's history (Slurm's accounting, Prometheus): not seen live."""
    smaller_fit: str | None = None
    """The smallest MIG slice of its GPU the job would have fitted (`MIG 2g.20gb`), from its peak memory and its
    p95 compute (SM activity where measured, else utilization); None when it needed its whole GPU, or too little
    is known."""

    def line(self, costs: CostModel) -> str:
        """`your job used 12 % of 4 GPUs for 3 h ($41)`."""
        util = f"{self.mean_util_pct:.0f} %" if self.mean_util_pct is not None else "an unknown share"
        fits = f"; it would have fitted a {self.smaller_fit} slice" if self.smaller_fit else ""
        return (f"job {self.id} used {util} of {self.gpu_count} GPU(s) for {_hours(self.hours)} "
                f"({costs.format(self.cost)}){fits}")


def _hours(h: float) -> str:
    return f"{h:.1f} h" if h < 10 else f"{h:.0f} h"


def _ts(d: datetime | None) -> float | None:
    return None if d is None else d.timestamp()


def _dt(x: float | None) -> datetime | None:
    return None if x is None else datetime.fromtimestamp(x, UTC)


def cost_of(t: JobTally, costs: CostModel) -> float:
    """Depreciation for the GPU-seconds held plus the energy drawn (config `costs`)."""
    return costs.capital_daily(t.model) / 86400 * t.gpu_s + costs.energy_cost(t.kwh)


def summary_of(t: JobTally, costs: CostModel) -> JobSummary:
    """A tally as the summary a user reads."""
    return JobStore._summary(_row(t, costs))


def ended_event(s: JobSummary, costs: CostModel) -> JobEndedEvent:
    """The `job.ended` event that closes an ended job's entity, for its rules (published by the engine)."""
    assert s.ended_at is not None
    data = JobEnded.model_validate({**s.model_dump(exclude={"cluster", "running", "last_seen"}),
                                    "cost_text": costs.format(s.cost)})
    event = make_event("job.ended", SCHEDULER_SOURCE, data, cluster=s.cluster, time=s.ended_at)
    assert isinstance(event, JobEndedEvent)
    return event


def p95s(t: JobTally) -> tuple[float | None, float | None, float | None]:
    """The job's utilization, SM activity and memory at their 95th percentile over its GPU-time, from its
    histograms: never under the truth (a bin's upper edge), never over the peak."""
    return p95s_of(t.util_hist, t.sm_hist, t.mem_hist, t.util_peak, t.mem_peak_mib)


def p95s_of(util_hist: Mapping[int, float], sm_hist: Mapping[int, float], mem_hist: Mapping[int, float],
            util_peak: float | None, mem_peak_mib: float | None) -> tuple[float | None, float | None, float | None]:
    """`p95s` from the histograms and peaks themselves (a tally's, or a stored row's)."""
    return (sparse_percentile(util_hist, 0.95, pct_edge, util_peak),
            sparse_percentile(sm_hist, 0.95, pct_edge, 100.0),
            sparse_percentile(mem_hist, 0.95, mem_edge, mem_peak_mib))


def smaller_fit(t: JobTally, costs: CostModel) -> str | None:
    """The MIG slice the job would have fitted (rules/usage/rightsize.py): its peak memory plus headroom (the
    safety rule: a slice never holds less), its p95 compute plus headroom (SM activity where measured, else
    utilization; the peak where a store from before the histograms has none); None when it needed its whole GPU
    or too little is known."""
    util95, sm95, _mem95 = p95s(t)
    use = WorkloadUse(key=f"job/{t.scheduler}/{t.id}", owner=t.user, team=None, model=t.model,
                      gpus=max(t.gpu_count, 1), held_hours=t.gpu_s / 3600, peak_mem_mib=t.mem_peak_mib,
                      p95_util_pct=util95 if util95 is not None else t.util_peak, sm_active_pct=sm95)
    fit = advise(use, [], costs, window_hours=max(t.gpu_s / 3600 / max(t.gpu_count, 1), 1.0))
    return fit.target if fit.kind == "mig" else None


def _row(t: JobTally, costs: CostModel) -> dict[str, Any]:
    row: dict[str, Any] = {c: getattr(t, c, None) for c in _COLUMNS}
    row.update({c: _ts(getattr(t, c)) for c in _TIMES}, nodes=json.dumps(t.nodes), cost=cost_of(t, costs),
               smaller_fit=smaller_fit(t, costs))
    row.update({c: json.dumps({str(b): round(v, 3) for b, v in sorted(getattr(t, c).items())}) for c in _HISTS})
    return row


def _hist(raw: str | None) -> dict[int, float]:
    return {int(b): float(v) for b, v in json.loads(raw).items()} if raw else {}


class JobStore:
    """The job_summaries table of the usage store's SQLite file; one writer (the engine), readers (the CLI)."""

    def __init__(self, path: Path | str) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), timeout=10, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        have = {r[1] for r in self._db.execute("PRAGMA table_info(job_summaries)")}
        for column, kind in _ADDED.items():
            if column not in have:
                with self._db:
                    self._db.execute(f"ALTER TABLE job_summaries ADD COLUMN {column} {kind}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def put(self, tallies: list[JobTally], costs: CostModel) -> None:
        """Write each tally's totals (running jobs again and again, ended ones a last time), one transaction."""
        rows = [tuple(row[c] for c in _COLUMNS) for row in (_row(t, costs) for t in tallies)]
        with self._db:
            self._db.executemany(_UPSERT, rows)

    def put_new(self, tallies: list[JobTally], costs: CostModel) -> int:
        """Write the tallies of jobs the store does not hold yet (simulated history never overwrites a job seen
        on the fleet, and writing it twice adds nothing); how many were new."""
        rows = [tuple(row[c] for c in _COLUMNS) for row in (_row(t, costs) for t in tallies)]
        with self._db:
            before = self._db.total_changes
            self._db.executemany(_INSERT_NEW, rows)
            return self._db.total_changes - before

    def put_imported(self, tallies: list[JobTally], costs: CostModel) -> int:
        """Write imported jobs: a job imported before is written again (importing twice gives the same store), a
        job the engine saw live is left as it is; how many were written."""
        rows = [tuple(row[c] for c in _COLUMNS) for row in (_row(t, costs) for t in tallies)]
        with self._db:
            before = self._db.total_changes
            self._db.executemany(_PUT_IMPORTED, rows)
            return self._db.total_changes - before

    def running(self) -> list[JobTally]:
        """The tallies of jobs not ended, to resume after a restart."""
        return [self._tally(r) for r in self._select("ended_at IS NULL", ())]

    def find(self, job_id: str, cluster: str | None = None) -> list[JobSummary]:
        where, args = "id = ?", [job_id]
        if cluster is not None:
            where += " AND cluster = ?"
            args.append(cluster)
        return [self._summary(r) for r in self._select(where, tuple(args))]

    def window(self, since: float, user: str | None = None) -> list[JobSummary]:
        """Jobs seen since `since` (epoch seconds), most recent first; one user's with `user`."""
        where = "last_seen >= ?"
        args: list[float | str] = [since]
        if user is not None:
            where += " AND user = ?"
            args.append(user)
        return sorted((self._summary(r) for r in self._select(where, tuple(args))), key=lambda s: s.last_seen,
                      reverse=True)

    def prune(self, before: float) -> int:
        with self._db:
            return self._db.execute("DELETE FROM job_summaries WHERE ended_at < ?", (before,)).rowcount

    def _select(self, where: str, args: tuple[Any, ...]) -> Iterator[dict[str, Any]]:
        sql = f"SELECT {', '.join(_COLUMNS)} FROM job_summaries WHERE {where}"
        with closing(self._db.execute(sql, args)) as cur:
            for r in cur:
                yield dict(zip(_COLUMNS, r, strict=True))

    @staticmethod
    def _tally(r: dict[str, Any]) -> JobTally:
        fields: dict[str, Any] = {c: r[c] for c in _COLUMNS
                                  if c not in ("nodes", "cost", "smaller_fit", *_TIMES, *_HISTS)}
        fields.update({c: _hist(r[c]) for c in _HISTS}, simulated=bool(r["simulated"]), imported=bool(r["imported"]))
        fields["exempt_until"] = _dt(r["exempt_until"])
        first, last = _dt(r["first_seen"]), _dt(r["last_seen"])
        assert first is not None and last is not None
        return JobTally(**fields, nodes=json.loads(r["nodes"]), first_seen=first, last_seen=last,
                        started_at=_dt(r["started_at"]), ended_at=_dt(r["ended_at"]))

    @staticmethod
    def _summary(r: dict[str, Any]) -> JobSummary:
        start = r["started_at"] if r["started_at"] is not None else r["first_seen"]
        end = r["ended_at"] if r["ended_at"] is not None else r["last_seen"]
        gpu_s = r["gpu_s"]
        util95, sm95, mem95 = p95s_of(_hist(r["util_hist"]), _hist(r["sm_hist"]), _hist(r["mem_hist"]),
                                      r["util_peak"], r["mem_peak_mib"])
        return JobSummary(
            cluster=r["cluster"], scheduler=r["scheduler"], id=r["id"], user=r["user"], name=r["name"],
            account=r["account"], partition=r["partition"], qos=r["qos"], namespace=r["namespace"],
            model=r["model"], nodes=json.loads(r["nodes"]), gpu_count=r["gpu_count"],
            started_at=_dt(r["started_at"]), ended_at=_dt(r["ended_at"]), last_seen=_dt(r["last_seen"]),
            running=r["ended_at"] is None, hours=round(max(0.0, end - start) / 3600, 3),
            gpu_hours=round(gpu_s / 3600, 3),
            mean_util_pct=round(r["util_s"] / r["util_known_s"], 1) if r["util_known_s"] else None,
            peak_util_pct=r["util_peak"],
            mean_sm_active_pct=round(r["sm_s"] / r["sm_known_s"], 1) if r["sm_known_s"] else None,
            peak_mem_mib=r["mem_peak_mib"], p95_util_pct=util95, p95_sm_active_pct=sm95,
            p95_mem_mib=None if mem95 is None else round(mem95),
            idle_share_pct=round(100 * r["idle_gpu_s"] / gpu_s, 1) if gpu_s else None,
            cost=round(r["cost"], 2), smaller_fit=r["smaller_fit"], exemption=r["exemption"],
            exempt_until=_dt(r["exempt_until"]), simulated=bool(r["simulated"]), imported=bool(r["imported"]),
        )
