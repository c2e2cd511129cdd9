"""The usage store: fit rows round-trip, old hours fold into days with every total kept, simulated usage is marked."""

from __future__ import annotations

from pathlib import Path

import pytest

from rules.usage.fits import FitAmounts, FitKey
from rules.usage.rollup import IdleJobAmounts, IdleJobKey, UsageAmounts, UsageBatch, UsageKey
from rules.usage.store import UsageStore

DAY = 86400
T = 20_000 * DAY  # a UTC midnight


def _batch(days: int) -> UsageBatch:
    usage = [(UsageKey(T + h * 3600, "c", "n1", g, "alice", "nlp"),
              UsageAmounts(model="H100", busy_s=1800, held_s=1200, free_s=600, util_s=90_000, util_known_s=3000,
                           busy_kwh=0.2, held_kwh=0.05, free_kwh=0.01))
             for h in range(days * 24) for g in range(8)]
    jobs = [(IdleJobKey(T + h * 3600, "c", "n1", 0, "job:7"), IdleJobAmounts(name="job 7", owner="alice", team="nlp",
                                                                            held_s=1200, held_kwh=0.05))
            for h in range(days * 24)]
    return UsageBatch(usage=usage, idle_jobs=jobs)


def test_old_hours_fold_into_days_and_every_total_is_kept(tmp_path: Path) -> None:
    with UsageStore(tmp_path / "u.sqlite") as store:
        store.add(_batch(10))
        fit = FitAmounts(owner="alice", team="nlp", model="H100", gpus=2, held_s=3600, peak_mem_mib=5000,
                         mem_total_mib=81559, util_hist=[3600.0] + [0.0] * 19, sm_hist=[0.0] * 20)
        store.add_fits([(FitKey(T + h * 3600, "c", "job/slurm/7"), fit) for h in range(10 * 24)])
        before = store.usage(0, 1e12)
        fits_before = store.fits(0, 1e12)
        folded = store.compact(T + 7 * DAY)  # the first seven days become days
        after = store.usage(0, 1e12)
        assert folded == 7 * 24 * 8
        assert len(after) == 7 + 3 * 24 * 8  # one row a day for the old week, hours for the last three days
        for field in ("busy_s", "held_s", "free_s", "util_s", "busy_kwh"):
            assert sum(getattr(r, field) for r in after) == pytest.approx(sum(getattr(r, field) for r in before))
        assert {r.gpu for r in after if r.hour < T + 7 * DAY} == {-1}
        assert sum(j.held_s for j in store.idle_jobs(0, 1e12)) == pytest.approx(10 * 24 * 1200)
        fits_after = store.fits(0, 1e12)
        assert len(fits_after) == 7 + 3 * 24
        assert sum(a.held_s for _, a in fits_after) == pytest.approx(sum(a.held_s for _, a in fits_before))
        assert sum(sum(a.util_hist) for _, a in fits_after) == pytest.approx(10 * 24 * 3600)
        assert max(a.gpus for _, a in fits_after) == 2 and max(a.peak_mem_mib for _, a in fits_after) == 5000
        assert store.compact(T + 7 * DAY) == 0  # folding again changes nothing


def test_a_store_with_simulated_usage_says_so(tmp_path: Path) -> None:
    with UsageStore(tmp_path / "u.sqlite") as store:
        assert not store.simulated()
        store.mark_simulated()
    with UsageStore(tmp_path / "u.sqlite") as store:
        assert store.simulated()
