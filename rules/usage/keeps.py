"""Owners' keeps in the usage store, and what the weekly report says of them: per team, how many, why, the
GPU-hours kept and the share of the kept time those GPUs stayed idle (from the hourly usage buckets)."""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel

from rules.usage.store import UsageRow

HOUR = 3600
REASONS_SHOWN = 10  # reasons listed per team

_SCHEMA = """
CREATE TABLE IF NOT EXISTS keeps (
    id TEXT PRIMARY KEY, cluster TEXT NOT NULL, rule TEXT NOT NULL, entity_id TEXT NOT NULL,
    gpus TEXT NOT NULL DEFAULT '[]', by TEXT NOT NULL DEFAULT '', reason TEXT NOT NULL DEFAULT '',
    start REAL NOT NULL, until REAL NOT NULL, asked_until REAL NOT NULL, approved_by TEXT NOT NULL DEFAULT '',
    team TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS keeps_until ON keeps (until);
"""
_COLUMNS = ("id", "cluster", "rule", "entity_id", "gpus", "by", "reason", "start", "until", "asked_until",
            "approved_by", "team")


@dataclass(frozen=True, slots=True)
class KeptGpu:
    node: str
    gpu: int


@dataclass(frozen=True, slots=True)
class KeepRow:
    """One keep as applied: the entity's GPUs when it was kept, who and why, from `start` to `until`."""

    id: str
    cluster: str
    rule: str
    entity_id: str
    gpus: tuple[KeptGpu, ...]
    by: str
    reason: str
    start: float
    until: float
    asked_until: float
    approved_by: str = ""
    team: str = ""  # the team of the kept entity when it was kept (its processes' or node's label): for budgets


class KeepStore:
    """The `keeps` table of the usage store (a table of its own, created where missing). One writer: the engine."""

    def __init__(self, path: Path | str) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, timeout=30)
        with self._db:
            self._db.executescript(_SCHEMA)
            if "team" not in {str(r[1]) for r in self._db.execute("PRAGMA table_info(keeps)")}:  # an older file
                self._db.execute("ALTER TABLE keeps ADD COLUMN team TEXT NOT NULL DEFAULT ''")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> KeepStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, row: KeepRow) -> None:
        """A keep applied at `row.start`: earlier keeps of the entity for the rule end there (a keep replaces the
        one before it); an approved extension (`approved_by`) continues the keep it extends."""
        with self._db:
            cur = self._db.execute(
                "SELECT id FROM keeps WHERE cluster = ? AND rule = ? AND entity_id = ? AND until > ? "
                "ORDER BY start DESC LIMIT 1", (row.cluster, row.rule, row.entity_id, row.start))
            last = cur.fetchone()
            if row.approved_by and last is not None:
                self._db.execute("UPDATE keeps SET until = ?, approved_by = ? WHERE id = ?",
                                 (row.until, row.approved_by, last[0]))
                return
            self._db.execute("UPDATE keeps SET until = ? WHERE cluster = ? AND rule = ? AND entity_id = ? "
                             "AND until > ?", (row.start, row.cluster, row.rule, row.entity_id, row.start))
            if row.until > row.start:
                self._db.execute(f"INSERT OR REPLACE INTO keeps ({', '.join(_COLUMNS)}) "
                                 f"VALUES ({', '.join('?' for _ in _COLUMNS)})", (
                                     row.id, row.cluster, row.rule, row.entity_id,
                                     json.dumps([[g.node, g.gpu] for g in row.gpus]), row.by, row.reason, row.start,
                                     row.until, row.asked_until, row.approved_by, row.team))

    def lift(self, cluster: str, rule: str, entity_id: str, at: float) -> None:
        """The entity's keep for the rule ends at `at` (a snooze lifted)."""
        with self._db:
            self._db.execute("UPDATE keeps SET until = ? WHERE cluster = ? AND rule = ? AND entity_id = ? "
                             "AND until > ?", (at, cluster, rule, entity_id, at))

    def window(self, since: float, until: float) -> list[KeepRow]:
        """Keeps that overlap [since, until)."""
        sql = f"SELECT {', '.join(_COLUMNS)} FROM keeps WHERE start < ? AND until > ? ORDER BY start"
        with closing(self._db.execute(sql, (until, since))) as cur:
            return [KeepRow(r[0], r[1], r[2], r[3], tuple(KeptGpu(n, int(g)) for n, g in json.loads(r[4])),
                            *r[5:]) for r in cur]

    def taken_since(self, since: float, by: str, team: str) -> tuple[int, int]:
        """Keeps taken from `since` on: by `by`, and of `team` ("" counts none); an approved extension is no new
        keep (it continues its row)."""
        sql = "SELECT COUNT(*) FILTER (WHERE by = ?), COUNT(*) FILTER (WHERE team = ? AND team != '') " \
              "FROM keeps WHERE start >= ?"
        with closing(self._db.execute(sql, (by, team, since))) as cur:
            owner, of_team = cur.fetchone()
        return int(owner), int(of_team)

    def prune(self, before: float) -> int:
        with self._db:
            return self._db.execute("DELETE FROM keeps WHERE until < ?", (before,)).rowcount


class KeepReason(BaseModel):
    entity_id: str
    rule: str
    by: str
    reason: str
    until: datetime
    gpu_hours: float
    idle_share_pct: float | None
    approved_by: str = ""


class TeamKeeps(BaseModel):
    """A team's keeps over the report's window (`team` "" : no team)."""

    team: str
    count: int
    budget: int | None = None  # the team's keeps_per_week, where one is set
    at_budget: list[str] = []  # owners who used their whole keep budget: "alice 3 of 3" (more waits for approval)
    kept_gpu_hours: float
    idle_share_pct: float | None  # of the kept GPU time that was measured, the share its GPUs stayed idle
    reasons: list[KeepReason]  # most kept GPU-hours first, at most REASONS_SHOWN


@dataclass
class _Tally:
    kept_s: float = 0.0
    idle_s: float = 0.0
    known_s: float = 0.0


def team_keeps(keeps: Iterable[KeepRow], usage: Iterable[UsageRow], since: float, until: float,
               team: str | None = None) -> list[TeamKeeps]:
    """Each team's keeps within [since, until): a keep's team is the one its GPUs were used by while kept (the
    most GPU time), its idle share is the held-idle and unallocated time of those GPUs over all their time."""
    by_gpu: dict[tuple[str, str, int], list[UsageRow]] = defaultdict(list)
    for r in usage:
        by_gpu[(r.cluster, r.node, r.gpu)].append(r)
    teams: dict[str, list[tuple[KeepRow, _Tally]]] = defaultdict(list)
    for k in keeps:
        start, end = max(k.start, since), min(k.until, until)
        if end <= start:
            continue
        tally, votes = _Tally(), defaultdict[str, float](float)
        for g in k.gpus:
            tally.kept_s += end - start
            for r in by_gpu.get((k.cluster, g.node, g.gpu), ()):
                share = max(0.0, min(r.hour + HOUR, end) - max(r.hour, start)) / HOUR
                if share <= 0:
                    continue
                tally.idle_s += share * (r.held_s + r.free_s)
                tally.known_s += share * (r.busy_s + r.held_s + r.free_s)
                votes[r.team] += share * (r.busy_s + r.held_s)
        name = max(votes, key=lambda t: (votes[t], t)) if votes else ""
        if team is None or name == team:
            teams[name].append((k, tally))
    out = []
    for name, items in teams.items():
        kept = sum(t.kept_s for _, t in items)
        known = sum(t.known_s for _, t in items)
        reasons = [KeepReason(entity_id=k.entity_id, rule=k.rule, by=k.by, reason=k.reason,
                              until=datetime.fromtimestamp(k.until, UTC), gpu_hours=round(t.kept_s / HOUR, 2),
                              idle_share_pct=round(100 * t.idle_s / t.known_s, 1) if t.known_s else None,
                              approved_by=k.approved_by)
                   for k, t in sorted(items, key=lambda kt: -kt[1].kept_s)][:REASONS_SHOWN]
        out.append(TeamKeeps(team=name, count=len(items), kept_gpu_hours=round(kept / HOUR, 2),
                             idle_share_pct=round(100 * sum(t.idle_s for _, t in items) / known, 1) if known else None,
                             reasons=reasons))
    return sorted(out, key=lambda t: (-t.kept_gpu_hours, t.team))
