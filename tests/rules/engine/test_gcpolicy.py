"""The engine's garbage-collection policy: freeze what survives, give Python its own thresholds back."""

from __future__ import annotations

import gc

from rules.engine.gcpolicy import GC_THRESHOLDS, GcPolicy


def test_the_policy_freezes_survivors_and_stop_gives_python_its_thresholds_back() -> None:
    before = gc.get_threshold()
    policy = GcPolicy()
    policy.start()
    try:
        assert gc.get_threshold() == GC_THRESHOLDS
        keep = [[i] for i in range(2_000)]
        policy.tick(len(keep))
        assert gc.get_freeze_count() > 0
    finally:
        policy.stop()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
