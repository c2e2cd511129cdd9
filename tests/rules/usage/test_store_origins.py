"""Where a store's hours came from: simulated and imported node-hours are marked as such, a report's window says
so only for its own hours, a store flagged simulated as a whole is migrated, live hours win over imported ones,
and importing a window twice gives the same store."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from rules.usage.fits import FitAmounts, FitKey
from rules.usage.rollup import IdleJobAmounts, IdleJobKey, UsageAmounts, UsageBatch, UsageKey
from rules.usage.store import SIMULATED, UsageStore

H = 3600
T = 20_000 * 86400  # a UTC midnight


def hours(node: str, first: int, n: int, busy_s: float = 1800.0, held_s: float = 0.0) -> UsageBatch:
    batch = UsageBatch()
    for h in range(first, first + n):
        batch.usage.append((UsageKey(T + h * H, "c0", node, 0, "alice" if held_s else "", "nlp"),
                            UsageAmounts(model="NVIDIA H100", busy_s=busy_s, held_s=held_s,
                                         free_s=H - busy_s - held_s)))
        if held_s:
            batch.idle_jobs.append((IdleJobKey(T + h * H, "c0", node, 0, "pod:ml/nb"),
                                    IdleJobAmounts(name="ml/nb", owner="alice", team="nlp", held_s=held_s)))
    return batch


def gpu_seconds(store: UsageStore) -> float:
    return sum(r.busy_s + r.held_s + r.free_s for r in store.usage(0, 1e12))


def test_a_report_window_is_simulated_only_where_its_hours_were(tmp_path: Path) -> None:
    with UsageStore(tmp_path / "u.sqlite") as store:
        sim = hours("n1", 0, 24)
        store.add(sim)
        store.mark_origin({(k.hour, k.cluster, k.node) for k, _ in sim.usage}, SIMULATED)
        store.add(hours("n1", 48, 24))  # live hours, a day later
        assert store.simulated()
        assert store.simulated(T, T + 24 * H)
        assert not store.simulated(T + 48 * H, T + 72 * H)
        assert not store.imported()


def test_a_store_flagged_simulated_as_a_whole_is_migrated_to_its_hours(tmp_path: Path) -> None:
    path = tmp_path / "u.sqlite"
    with UsageStore(path) as store:
        store.add(hours("n1", 0, 24))
    with sqlite3.connect(path) as db:  # what a store from before origins held: one flag for the whole file
        db.execute("DELETE FROM origins")
        db.execute("INSERT INTO meta (key, value) VALUES ('simulated', '1')")
    with UsageStore(path) as store:
        assert store.simulated(T, T + 24 * H)
        store.add(hours("n1", 48, 24))  # recorded after the migration: live
        assert not store.simulated(T + 48 * H, T + 72 * H)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM meta WHERE key = 'simulated'").fetchone() == (0,)


def test_importing_a_window_twice_gives_the_same_store(tmp_path: Path) -> None:
    fits = [(FitKey(T + h * H, "c0", "pod/ml/nb"), FitAmounts(owner="alice", team="nlp", held_s=1800.0))
            for h in range(24)]
    with UsageStore(tmp_path / "u.sqlite") as store:
        first = store.replace_imported(hours("n1", 0, 24, busy_s=600, held_s=1800), fits, "c0", T, T + 24 * H)
        once = (store.usage(0, 1e12), store.idle_jobs(0, 1e12), store.fits(0, 1e12))
        again = store.replace_imported(hours("n1", 0, 24, busy_s=600, held_s=1800), fits, "c0", T, T + 24 * H)
        assert (store.usage(0, 1e12), store.idle_jobs(0, 1e12), store.fits(0, 1e12)) == once
        assert first.hours == again.hours == 24
        assert store.imported(T, T + H) and not store.simulated()


def test_live_hours_win_over_imported_ones(tmp_path: Path) -> None:
    with UsageStore(tmp_path / "u.sqlite") as store:
        store.add(hours("n1", 0, 2, busy_s=3600))  # the engine recorded the first two hours
        wrote = store.replace_imported(hours("n1", 0, 6, busy_s=0), [], "c0", T, T + 6 * H)
        assert (wrote.hours, wrote.live) == (4, 2)
        assert sum(r.busy_s for r in store.usage(0, 1e12)) == 2 * 3600  # the live hours, not the imported ones
        store.add(hours("n1", 3, 1, busy_s=900))  # the engine comes back to an imported hour: it wins there
        row = [r for r in store.usage(T + 3 * H, T + 4 * H)]
        assert [(r.busy_s, r.free_s) for r in row] == [(900, 2700)]
        assert not store.imported(T + 3 * H, T + 4 * H) and store.imported(T + 4 * H, T + 6 * H)
        assert gpu_seconds(store) == 6 * 3600


def test_an_import_replaces_simulated_hours_where_it_has_real_ones(tmp_path: Path) -> None:
    with UsageStore(tmp_path / "u.sqlite") as store:
        sim = hours("n1", 0, 4, busy_s=3600)
        store.add(sim)
        store.mark_origin({(k.hour, k.cluster, k.node) for k, _ in sim.usage}, SIMULATED)
        store.replace_imported(hours("n1", 0, 2, busy_s=0), [], "c0", T, T + 2 * H)
        assert not store.simulated(T, T + 2 * H) and store.simulated(T + 2 * H, T + 4 * H)
        assert sum(r.busy_s for r in store.usage(T, T + 2 * H)) == 0
        assert gpu_seconds(store) == 4 * 3600
