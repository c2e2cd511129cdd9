"""Durable usage rollups in one SQLite file: hourly buckets added up in place, pruned by age."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rules.usage.fits import BINS, FitAmounts, FitKey
from rules.usage.rollup import UsageBatch
from rules.usage.store_sql import ADD_FIT as _ADD_FIT
from rules.usage.store_sql import ADD_JOB as _ADD_JOB
from rules.usage.store_sql import ADD_USAGE as _ADD_USAGE
from rules.usage.store_sql import ADDED_USAGE_COLUMNS as _ADDED_USAGE_COLUMNS
from rules.usage.store_sql import FIT_COLUMNS as _FIT_COLUMNS
from rules.usage.store_sql import FITS_SCHEMA as _FITS_SCHEMA
from rules.usage.store_sql import HIST_COLUMNS as _HIST_COLUMNS
from rules.usage.store_sql import IMPORTED as IMPORTED
from rules.usage.store_sql import SCHEMA as _SCHEMA
from rules.usage.store_sql import SIMULATED as SIMULATED

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class UsageRow:
    """One stored hourly bucket of one GPU for one owner and team."""

    hour: int
    cluster: str
    node: str
    gpu: int
    owner: str
    team: str
    model: str
    busy_s: float
    held_s: float
    free_s: float
    util_s: float
    util_known_s: float
    busy_kwh: float
    held_kwh: float
    free_kwh: float
    #: held with no activity signal (a MIG instance without GPM or dcgm-exporter): neither busy nor idle
    unknown_s: float = 0.0
    unknown_kwh: float = 0.0
    cap_saved_kwh: float = 0.0  # energy power caps saved


_SUMMED = ("busy_s", "held_s", "free_s", "util_s", "util_known_s", "busy_kwh", "held_kwh", "free_kwh",
           "unknown_s", "unknown_kwh", "cap_saved_kwh")


@dataclass(slots=True, frozen=True)
class IdleJobRow:
    hour: int
    cluster: str
    node: str
    gpu: int
    job: str
    name: str
    owner: str
    team: str
    model: str
    held_s: float
    held_kwh: float


@dataclass(slots=True, frozen=True)
class ImportWrite:
    """What one imported window wrote: node-hours, and node-hours left alone as the engine recorded them live."""

    hours: int
    live: int
    folded_days: int = 0
    """Days the engine had already folded into daily totals (engine.usage_hourly_for): left as they were."""


def _fresh(hour: int, node: str, since: float, until: float, live: set[tuple[int, str]], folded: set[int]) -> bool:
    return since <= hour < until and (hour, node) not in live and hour - hour % 86400 not in folded


def _fit_rows(items: list[tuple[FitKey, FitAmounts]]) -> list[tuple[Any, ...]]:
    return [(k.hour, k.cluster, k.workload, a.owner, a.team, a.model, a.node, a.gpus, a.held_s, a.peak_mem_mib,
             a.mem_total_mib, *map(round, a.util_hist), *map(round, a.sm_hist))  # whole seconds: small ints
            for k, a in items]


def _migrate_simulated_flag(db: sqlite3.Connection) -> None:
    """A store from before origins said `simulated` once for the whole file: every node-hour it held then becomes a
    simulated one (which of them were real it never knew), and the hours recorded from now on are live."""
    if db.execute("SELECT 1 FROM meta WHERE key = 'simulated'").fetchone() is None:
        return
    with db:
        db.execute("INSERT OR IGNORE INTO origins (hour, cluster, node, origin) "
                   f"SELECT DISTINCT hour, cluster, node, '{SIMULATED}' FROM usage")
        db.execute("DELETE FROM meta WHERE key = 'simulated'")
    log.info("usage store: the simulated flag now belongs to the hours it held, not to the whole file")


class UsageStore:
    """The SQLite file behind rollups. One writer (the engine); readers (reports) may come and go.

    The file is known by its identity (device and inode) as well as its path: when someone deletes or replaces
    it, the next use says so in the log and opens the file at the path again (a new, empty one when it was
    deleted), instead of writing on into an unlinked file no report can read and that no one can free."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._memory = str(path) == ":memory:"
        self._reopening = threading.Lock()  # the writer (a worker thread) and readers may notice at once
        self._db = self._open()
        self._identity = self._current_identity()

    def _open(self) -> sqlite3.Connection:
        if not self._memory:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(":memory:" if self._memory else str(self.path), timeout=10, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        db.executescript(_FITS_SCHEMA)
        have = {str(r[1]) for r in db.execute("PRAGMA table_info(usage)")}
        for column, kind in _ADDED_USAGE_COLUMNS.items():
            if column not in have:
                db.execute(f"ALTER TABLE usage ADD COLUMN {column} {kind}")
        _migrate_simulated_flag(db)
        return db

    def _current_identity(self) -> tuple[int, int] | None:
        if self._memory:
            return None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def _ensure_file(self) -> None:
        """Reopen the file at the path if the one open is not it any more (deleted, or replaced)."""
        if self._memory:
            return
        with self._reopening:
            self._reopen_if_changed()

    def _reopen_if_changed(self) -> None:
        now = self._current_identity()
        if now is not None and now == self._identity:
            return
        what = "was deleted: a new, empty one is created" if now is None else "was replaced: the new file is used"
        log.warning("the usage database %s %s (the rollups in the old one are not in it)", self.path, what)
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        # SQLite leaves the old file's write-ahead log at `<path>-wal` (it does not checkpoint into a file that
        # has moved): opened with the new file, its pages would overwrite it. They belong to the old file.
        for stale in (f"{self.path}-wal", f"{self.path}-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        self._db = self._open()
        self._identity = self._current_identity()

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> UsageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, batch: UsageBatch) -> None:
        """Add a drained batch to the stored buckets, in one transaction. A node-hour an import wrote gives way to
        the live one (what was imported there goes; the engine's own reading wins)."""
        self._ensure_file()
        with self._db:
            self._drop_imported({(k.hour, k.cluster, k.node) for k, _ in batch.usage})
            self._write(batch)

    def _drop_imported(self, keys: set[tuple[int, str, str]]) -> None:
        hours = sorted({h for h, _c, _n in keys})  # a flush holds an hour or two
        sql = f"SELECT 1 FROM origins WHERE origin = ? AND hour IN ({', '.join('?' for _ in hours)}) LIMIT 1"
        with closing(self._db.execute(sql, (IMPORTED, *hours))) as cur:
            if cur.fetchone() is None:  # the engine's flush costs one indexed lookup where nothing was imported
                return
        found = [k for k in keys if self._db.execute(
            "SELECT 1 FROM origins WHERE hour = ? AND cluster = ? AND node = ? AND origin = ?", (*k, IMPORTED)
        ).fetchone() is not None]
        for table in ("usage", "idle_jobs", "origins"):
            self._db.executemany(f"DELETE FROM {table} WHERE hour = ? AND cluster = ? AND node = ?", found)

    def _write(self, batch: UsageBatch) -> None:
        self._db.executemany(_ADD_USAGE, [
            (k.hour, k.cluster, k.node, k.gpu, k.owner, k.team, a.model, a.busy_s, a.held_s, a.free_s, a.util_s,
             a.util_known_s, a.busy_kwh, a.held_kwh, a.free_kwh, a.unknown_s, a.unknown_kwh, a.cap_saved_kwh)
            for k, a in batch.usage])
        self._db.executemany(_ADD_JOB, [
            (k.hour, k.cluster, k.node, k.gpu, k.job, a.name, a.owner, a.team, a.model, a.held_s, a.held_kwh)
            for k, a in batch.idle_jobs])

    def add_fits(self, items: list[tuple[FitKey, FitAmounts]]) -> None:
        self._ensure_file()
        with self._db:
            self._db.executemany(_ADD_FIT, _fit_rows(items))

    def fits(self, since: float, until: float) -> list[tuple[FitKey, FitAmounts]]:
        """What each workload used, per hour, in [since, until)."""
        sql = f"SELECT {', '.join(_FIT_COLUMNS)} FROM fits WHERE hour >= ? AND hour < ?"
        out = []
        self._ensure_file()
        with closing(self._db.execute(sql, (since, until))) as cur:
            for r in cur:
                hist = [float(x) for x in r[11:]]
                out.append((FitKey(int(r[0]), r[1], r[2]),
                            FitAmounts(owner=r[3], team=r[4], model=r[5], node=r[6], gpus=int(r[7]),
                                       held_s=float(r[8]), peak_mem_mib=float(r[9]), mem_total_mib=float(r[10]),
                                       util_hist=hist[:BINS], sm_hist=hist[BINS:])))
        return out

    def mark_origin(self, keys: Iterable[tuple[int, str, str]], origin: str) -> None:
        """Say that these (hour, cluster, node) buckets were written by `origin` (SIMULATED or IMPORTED), not live."""
        self._ensure_file()
        with self._db:
            self._db.executemany("INSERT OR REPLACE INTO origins (hour, cluster, node, origin) VALUES (?, ?, ?, ?)",
                                 [(h, c, n, origin) for h, c, n in keys])

    def simulated(self, since: float | None = None, until: float | None = None) -> bool:
        """Whether any simulated hour lies in [since, until) (the whole store without them): a report of a window
        says so only when its own hours include simulated ones."""
        return self._has_origin(SIMULATED, since, until)

    def imported(self, since: float | None = None, until: float | None = None) -> bool:
        return self._has_origin(IMPORTED, since, until)

    def _has_origin(self, origin: str, since: float | None, until: float | None) -> bool:
        self._ensure_file()
        sql = "SELECT 1 FROM origins WHERE origin = ? AND hour >= ? AND hour < ? LIMIT 1"
        with closing(self._db.execute(sql, (origin, since if since is not None else -math.inf,
                                            until if until is not None else math.inf))) as cur:
            return cur.fetchone() is not None

    def replace_imported(self, batch: UsageBatch, fits: list[tuple[FitKey, FitAmounts]], cluster: str,
                         since: float, until: float) -> ImportWrite:
        """Write the imported hours of [since, until) of `cluster`, one transaction: what an earlier import wrote
        there goes first (importing a window twice gives the same store), a simulated node-hour gives way to an
        imported one, and a node-hour the engine recorded live is left as it is (live wins)."""
        self._ensure_file()
        window = (since, until, cluster)
        with self._db:
            live = {(int(h), n) for h, n in self._db.execute(
                "SELECT DISTINCT u.hour, u.node FROM usage u LEFT JOIN origins o ON o.hour = u.hour AND "
                "o.cluster = u.cluster AND o.node = u.node WHERE u.hour >= ? AND u.hour < ? AND u.cluster = ? "
                "AND u.gpu >= 0 AND o.origin IS NULL", window)}
            folded = {int(d) for (d,) in self._db.execute(  # days the engine folded: what they held is not known
                "SELECT DISTINCT hour FROM usage WHERE gpu = -1 AND hour >= ? AND hour < ? AND cluster = ?",
                (since - 86400, until, cluster))}
            stale = ("SELECT hour, cluster, node FROM origins "
                     "WHERE hour >= ? AND hour < ? AND cluster = ? AND origin = ?")
            for table in ("usage", "idle_jobs"):
                self._db.execute(f"DELETE FROM {table} WHERE (hour, cluster, node) IN ({stale})", (*window, IMPORTED))
            self._db.execute("DELETE FROM origins WHERE hour >= ? AND hour < ? AND cluster = ? AND origin = ?",
                             (*window, IMPORTED))
            self._db.execute("DELETE FROM fits WHERE (hour, cluster, workload) IN (SELECT hour, cluster, workload "
                             "FROM fit_origins WHERE hour >= ? AND hour < ? AND cluster = ?)", window)
            self._db.execute("DELETE FROM fit_origins WHERE hour >= ? AND hour < ? AND cluster = ?", window)
            keep = UsageBatch(
                usage=[(k, a) for k, a in batch.usage if _fresh(k.hour, k.node, since, until, live, folded)],
                idle_jobs=[(k, a) for k, a in batch.idle_jobs if _fresh(k.hour, k.node, since, until, live, folded)])
            hours = {(k.hour, k.cluster, k.node) for k, _ in keep.usage}
            for table in ("usage", "idle_jobs"):  # a simulated node-hour gives way
                self._db.executemany(f"DELETE FROM {table} WHERE hour = ? AND cluster = ? AND node = ?", hours)
            self._db.executemany("INSERT OR REPLACE INTO origins (hour, cluster, node, origin) VALUES (?, ?, ?, ?)",
                                 [(*k, IMPORTED) for k in hours])
            self._write(keep)
            live_hours = {h for h, _n in live}
            fresh = [(k, a) for k, a in fits if since <= k.hour < until and k.hour not in live_hours
                     and k.hour - k.hour % 86400 not in folded]
            self._db.executemany(_ADD_FIT, _fit_rows(fresh))
            self._db.executemany("INSERT OR IGNORE INTO fit_origins (hour, cluster, workload) VALUES (?, ?, ?)",
                                 [(k.hour, k.cluster, k.workload) for k, _a in fresh])
        return ImportWrite(hours=len(hours), live=len(live), folded_days=len(folded))

    def prune(self, before: float, fits_since: float = 0.0) -> int:
        """Delete buckets that started before `before` (epoch seconds), and fit rows before `fits_since` too;
        returns how many rows went."""
        self._ensure_file()
        with self._db:
            n = self._db.execute("DELETE FROM usage WHERE hour < ?", (before,)).rowcount
            n += self._db.execute("DELETE FROM idle_jobs WHERE hour < ?", (before,)).rowcount
            n += self._db.execute("DELETE FROM fits WHERE hour < ?", (max(before, fits_since),)).rowcount
            self._db.execute("DELETE FROM origins WHERE hour < ?", (before,))
            self._db.execute("DELETE FROM fit_origins WHERE hour < ?", (max(before, fits_since),))
        return n

    def compact(self, before: float, fits_before: float | None = None) -> int:
        """Fold the hourly buckets that started before `before` into daily ones (UTC days; a daily usage bucket has
        no node and GPU -1: per-node detail is only shown for recent hours), so a year of a large fleet stays small; fit
        rows before `fits_before` (default `before`: right-sizing looks at days, not hours). Returns how many
        hourly usage rows were folded."""
        fits_before = before if fits_before is None else fits_before
        self._ensure_file()
        day = "(hour - hour % 86400)"
        sums = ", ".join(f"SUM({c})" for c in _SUMMED)
        with self._db:
            self._db.execute(
                f"""INSERT INTO usage (hour, cluster, node, gpu, owner, team, model, {", ".join(_SUMMED)})
                    SELECT {day}, cluster, '', -1, owner, team, MAX(model), {sums}
                    FROM usage WHERE hour < ? AND gpu >= 0 GROUP BY {day}, cluster, owner, team
                    ON CONFLICT (hour, cluster, node, gpu, owner, team) DO UPDATE SET
                    busy_s = usage.busy_s + excluded.busy_s, held_s = usage.held_s + excluded.held_s,
                    free_s = usage.free_s + excluded.free_s, util_s = usage.util_s + excluded.util_s,
                    util_known_s = usage.util_known_s + excluded.util_known_s,
                    busy_kwh = usage.busy_kwh + excluded.busy_kwh, held_kwh = usage.held_kwh + excluded.held_kwh,
                    free_kwh = usage.free_kwh + excluded.free_kwh, unknown_s = usage.unknown_s + excluded.unknown_s,
                    unknown_kwh = usage.unknown_kwh + excluded.unknown_kwh,
                    cap_saved_kwh = usage.cap_saved_kwh + excluded.cap_saved_kwh""", (before,))
            n = self._db.execute("DELETE FROM usage WHERE hour < ? AND gpu >= 0", (before,)).rowcount
            self._db.execute(
                f"""INSERT INTO idle_jobs (hour, cluster, node, gpu, job, name, owner, team, model, held_s, held_kwh)
                    SELECT {day}, cluster, node, -1, job, MAX(name), MAX(owner), MAX(team), MAX(model),
                           SUM(held_s), SUM(held_kwh)
                    FROM idle_jobs WHERE hour < ? AND gpu >= 0 GROUP BY {day}, cluster, node, job
                    ON CONFLICT (hour, cluster, node, gpu, job) DO UPDATE SET
                    held_s = idle_jobs.held_s + excluded.held_s, held_kwh = idle_jobs.held_kwh + excluded.held_kwh""",
                (before,))
            self._db.execute("DELETE FROM idle_jobs WHERE hour < ? AND gpu >= 0", (before,))
            hist = ", ".join(f"SUM({c})" for c in _HIST_COLUMNS)
            rows = self._db.execute(
                f"""SELECT {day}, cluster, workload, MAX(owner), MAX(team), MAX(model), MAX(node), MAX(gpus),
                           SUM(held_s), MAX(peak_mem_mib), MAX(mem_total_mib), {hist}
                    FROM fits WHERE hour < ? AND hour % 86400 != 0 GROUP BY {day}, cluster, workload""",
                (fits_before,)).fetchall()
            self._db.execute("DELETE FROM fits WHERE hour < ? AND hour % 86400 != 0", (fits_before,))
            self._db.executemany(_ADD_FIT, rows)
        return n

    def recorded_hours(self, since: float, until: float) -> set[tuple[int, str, str]]:
        """The (hour, cluster, node) buckets with any usage in [since, until)."""
        sql = "SELECT DISTINCT hour, cluster, node FROM usage WHERE hour >= ? AND hour < ?"
        self._ensure_file()
        with closing(self._db.execute(sql, (since, until))) as cur:
            return {(int(h), c, n) for h, c, n in cur}

    def usage(self, since: float, until: float, team: str | None = None) -> list[UsageRow]:
        """Buckets that start in [since, until), optionally for one team."""
        return [UsageRow(*r) for r in self._rows("usage", since, until, team)]

    def week_sums(self, since: float, until: float, team: str | None = None,
                  step: float = 7 * 86400.0) -> list[UsageRow]:
        """The usage of [since, until) added up in SQLite per `step` from `since` (a week), team, model and whether
        somebody held it: a row per bucket, starting at its step (`owner` "*" held, "" not; no node, `gpu` -2).
        What a quarter's KPI reads, a few hundred rows however large the fleet; exact, as every figure is a sum
        and costs are linear in them."""
        sums = ", ".join(f"SUM({c})" for c in _SUMMED)
        sql = (f"SELECT CAST((hour - ?) / ? AS INTEGER) AS w, team, model, owner != '' AS held, {sums} FROM usage "
               "WHERE hour >= ? AND hour < ?" + (" AND team = ?" if team is not None else "")
               + " GROUP BY w, team, model, held")
        args: list[object] = [since, step, since, until] + ([team] if team is not None else [])
        self._ensure_file()
        with closing(self._db.execute(sql, args)) as cur:
            # a bucket's hour is its step's start, rounded up: a fractional `since` must not put it in the step before
            return [UsageRow(math.ceil(since + w * step), "", "", -2, "*" if held else "", t, m, *v)
                    for w, t, m, held, *v in cur]

    def idle_jobs(self, since: float, until: float, team: str | None = None) -> list[IdleJobRow]:
        return [IdleJobRow(*r) for r in self._rows("idle_jobs", since, until, team)]

    def _rows(self, table: str, since: float, until: float, team: str | None) -> Iterator[tuple[Any, ...]]:
        columns = ", ".join(f.name for f in fields(UsageRow if table == "usage" else IdleJobRow))
        sql = f"SELECT {columns} FROM {table} WHERE hour >= ? AND hour < ?"
        args: list[object] = [since, until]
        if team is not None:
            sql += " AND team = ?"
            args.append(team)
        self._ensure_file()
        with closing(self._db.execute(sql, args)) as cur:
            yield from cur
