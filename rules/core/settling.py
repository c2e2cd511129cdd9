"""What a restart left to settle: restored incidents not seen yet or of changed rules, and deferred firings.

The bookkeeping only; `recovery.Recovery` acts on it. Evaluation reads it (a fleet-share firing waits until the
fleet has been observed) and tells it when an incident closes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from rules.core.incidents import Incident


@dataclass(slots=True)
class Settling:
    """What a restore left to settle, and when the core started (its first step, or the restore's `now`)."""

    settle_s: float  # how long after the start the fleet counts as observed
    restored: bool = False  # `restore` was called: an engine resuming, which catches up missed cron instants
    restored_at: datetime | None = None
    orphans: set[tuple[str, str]] = field(default_factory=set)  # restored incidents whose entity is not seen yet
    stale: set[tuple[str, str]] = field(default_factory=set)  # restored incidents whose rule changed meanwhile
    removed: list[Incident] = field(default_factory=list)  # restored incidents of rules that no longer exist
    deferred: set[str] = field(default_factory=set)  # rules whose firing waits until the fleet is observed
    fleet_limited: set[str] = field(default_factory=set)  # rules with a destructive action under a fleet share

    def fleet_unobserved(self, rule: str, now: datetime) -> bool:
        """Whether `rule`'s fleet share would be decided on a fleet only partly seen since the restore."""
        return (
            self.restored and rule in self.fleet_limited and self.restored_at is not None
            and (now - self.restored_at).total_seconds() < self.settle_s
        )

    def defer(self, rule: str) -> None:
        self.deferred.add(rule)

    def forget(self, rule: str, key: str) -> None:
        """The (rule, key) incident closed or was dropped: nothing left to settle for it."""
        if self.orphans:
            self.orphans.discard((rule, key))
        if self.stale:
            self.stale.discard((rule, key))
