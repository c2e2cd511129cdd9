"""The usage store's SQLite schema and its write statements (rules/usage/store.py runs them)."""

from __future__ import annotations

from rules.usage.fits import BINS

SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    hour INTEGER NOT NULL, cluster TEXT NOT NULL, node TEXT NOT NULL, gpu INTEGER NOT NULL,
    owner TEXT NOT NULL, team TEXT NOT NULL, model TEXT NOT NULL DEFAULT '',
    busy_s REAL NOT NULL DEFAULT 0, held_s REAL NOT NULL DEFAULT 0, free_s REAL NOT NULL DEFAULT 0,
    util_s REAL NOT NULL DEFAULT 0, util_known_s REAL NOT NULL DEFAULT 0,
    busy_kwh REAL NOT NULL DEFAULT 0, held_kwh REAL NOT NULL DEFAULT 0, free_kwh REAL NOT NULL DEFAULT 0,
    unknown_s REAL NOT NULL DEFAULT 0, unknown_kwh REAL NOT NULL DEFAULT 0, cap_saved_kwh REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, cluster, node, gpu, owner, team)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS usage_team_hour ON usage (team, hour);
CREATE TABLE IF NOT EXISTS idle_jobs (
    hour INTEGER NOT NULL, cluster TEXT NOT NULL, node TEXT NOT NULL, gpu INTEGER NOT NULL,
    job TEXT NOT NULL, name TEXT NOT NULL, owner TEXT NOT NULL, team TEXT NOT NULL,
    model TEXT NOT NULL DEFAULT '', held_s REAL NOT NULL DEFAULT 0, held_kwh REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, cluster, node, gpu, job)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idle_jobs_hour ON idle_jobs (hour);
"""

HIST_COLUMNS = tuple(f"u{i}" for i in range(BINS)) + tuple(f"s{i}" for i in range(BINS))
FITS_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS fits (
    hour INTEGER NOT NULL, cluster TEXT NOT NULL, workload TEXT NOT NULL,
    owner TEXT NOT NULL DEFAULT '', team TEXT NOT NULL DEFAULT '', model TEXT NOT NULL DEFAULT '',
    node TEXT NOT NULL DEFAULT '', gpus INTEGER NOT NULL DEFAULT 0, held_s REAL NOT NULL DEFAULT 0,
    peak_mem_mib REAL NOT NULL DEFAULT 0, mem_total_mib REAL NOT NULL DEFAULT 0,
    {", ".join(f"{c} REAL NOT NULL DEFAULT 0" for c in HIST_COLUMNS)},
    PRIMARY KEY (hour, cluster, workload)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS fits_hour ON fits (hour);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS origins (
    hour INTEGER NOT NULL, cluster TEXT NOT NULL, node TEXT NOT NULL, origin TEXT NOT NULL,
    PRIMARY KEY (hour, cluster, node)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS origins_origin ON origins (origin, hour);
CREATE TABLE IF NOT EXISTS fit_origins (
    hour INTEGER NOT NULL, cluster TEXT NOT NULL, workload TEXT NOT NULL, PRIMARY KEY (hour, cluster, workload)
) WITHOUT ROWID;
"""
"""`origins` says which node-hours were not recorded live: `simulated` (gpuevents simulate --history) or `imported`
(gpuevents import); a node-hour without a row was recorded by the engine. `fit_origins`: the imported fit rows."""
SIMULATED = "simulated"
IMPORTED = "imported"
FIT_COLUMNS = ("hour", "cluster", "workload", "owner", "team", "model", "node", "gpus", "held_s",
                "peak_mem_mib", "mem_total_mib", *HIST_COLUMNS)
ADD_FIT = f"""
INSERT INTO fits ({", ".join(FIT_COLUMNS)}) VALUES ({", ".join("?" for _ in FIT_COLUMNS)})
ON CONFLICT (hour, cluster, workload) DO UPDATE SET
    owner = CASE WHEN fits.owner != '' THEN fits.owner ELSE excluded.owner END,
    team = CASE WHEN fits.team != '' THEN fits.team ELSE excluded.team END,
    model = CASE WHEN fits.model != '' THEN fits.model ELSE excluded.model END,
    node = CASE WHEN fits.node != '' THEN fits.node ELSE excluded.node END,
    gpus = MAX(fits.gpus, excluded.gpus), held_s = fits.held_s + excluded.held_s,
    peak_mem_mib = MAX(fits.peak_mem_mib, excluded.peak_mem_mib),
    mem_total_mib = MAX(fits.mem_total_mib, excluded.mem_total_mib),
    {", ".join(f"{c} = fits.{c} + excluded.{c}" for c in HIST_COLUMNS)}
"""

ADD_USAGE = """
INSERT INTO usage (hour, cluster, node, gpu, owner, team, model, busy_s, held_s, free_s,
                   util_s, util_known_s, busy_kwh, held_kwh, free_kwh, unknown_s, unknown_kwh, cap_saved_kwh)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (hour, cluster, node, gpu, owner, team) DO UPDATE SET
    model = CASE WHEN excluded.model != '' THEN excluded.model ELSE usage.model END,
    busy_s = usage.busy_s + excluded.busy_s, held_s = usage.held_s + excluded.held_s,
    free_s = usage.free_s + excluded.free_s, util_s = usage.util_s + excluded.util_s,
    util_known_s = usage.util_known_s + excluded.util_known_s,
    busy_kwh = usage.busy_kwh + excluded.busy_kwh, held_kwh = usage.held_kwh + excluded.held_kwh,
    free_kwh = usage.free_kwh + excluded.free_kwh, unknown_s = usage.unknown_s + excluded.unknown_s,
    unknown_kwh = usage.unknown_kwh + excluded.unknown_kwh, cap_saved_kwh = usage.cap_saved_kwh + excluded.cap_saved_kwh
"""
#: columns added after the first release, with their type: added to an older file when it is opened
ADDED_USAGE_COLUMNS = {"unknown_s": "REAL NOT NULL DEFAULT 0", "unknown_kwh": "REAL NOT NULL DEFAULT 0",
                        "cap_saved_kwh": "REAL NOT NULL DEFAULT 0"}

ADD_JOB = """
INSERT INTO idle_jobs (hour, cluster, node, gpu, job, name, owner, team, model, held_s, held_kwh)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (hour, cluster, node, gpu, job) DO UPDATE SET
    held_s = idle_jobs.held_s + excluded.held_s, held_kwh = idle_jobs.held_kwh + excluded.held_kwh
"""
