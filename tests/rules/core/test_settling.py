"""The restart's bookkeeping: a fleet-share firing waits while the fleet is only partly observed."""

from __future__ import annotations

from rules.core.settling import Settling
from tests.rules.helpers import at


def test_a_fleet_limited_rule_is_unobserved_only_after_a_restore_and_until_it_settles() -> None:
    s = Settling(settle_s=45.0, fleet_limited={"scale-down"}, restored_at=at(0))
    assert not s.fleet_unobserved("scale-down", at(10))  # a fresh start: nothing restored, nothing to wait for
    s.restored = True
    assert s.fleet_unobserved("scale-down", at(44)) and not s.fleet_unobserved("scale-down", at(45))
    assert not s.fleet_unobserved("idle", at(10))  # no destructive action under a fleet share


def test_a_closed_incident_leaves_nothing_to_settle() -> None:
    s = Settling(settle_s=45.0, orphans={("idle", "n1/gpu0"), ("idle", "n2/gpu0")}, stale={("idle", "n1/gpu0")})
    s.forget("idle", "n1/gpu0")
    assert s.orphans == {("idle", "n2/gpu0")} and s.stale == set()
