"""Liveness: a node is online while it reports, offline after three missed snapshots, gone after the grace.

Missing data is not evidence: rules are not evaluated on an offline node (its incidents neither promote nor
resolve) and end as `gone` after `engine.offline_grace`. Rules that read `online` / `last_seen` are the
exception: they see a node go offline at once, and their open incident keeps the node past the grace. A node
forgotten (past its grace, or `ForgetNode`) takes its entities with it; the jobs it held a part of are rebuilt
from their other nodes and evaluated again at once.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from rules.core.book import IncidentBook
from rules.core.evaluation import Evaluator
from rules.core.inputs import StepResult
from rules.core.plan import RulePlan
from rules.core.state import FleetState, NodeState

OFFLINE_AFTER_INTERVALS = 3
"""A node is offline once this many snapshot intervals passed without a word from it."""


class Liveness:
    """Each node's online state, and forgetting nodes; changes only the fleet's online marks and node set."""

    def __init__(self, plan: RulePlan, state: FleetState, book: IncidentBook, evaluator: Evaluator, *,
                 detection: bool, snapshot_interval_s: float, offline_grace_s: float) -> None:
        self.plan = plan
        self.state = state
        self.book = book
        self.evaluator = evaluator
        self.detection = detection
        self.snapshot_interval_s = snapshot_interval_s
        self.offline_grace_s = offline_grace_s

    def offline_at(self, ns: NodeState) -> datetime | None:
        """When the node counts as offline (at once for an agent that said it stops); None: never."""
        if ns.stopping:
            return ns.last_seen
        if not self.detection or ns.last_seen is None:
            return None
        interval = ns.interval_s or self.snapshot_interval_s
        return ns.last_seen + timedelta(seconds=OFFLINE_AFTER_INTERVALS * interval)

    def check_online(self, ns: NodeState, now: datetime, out: StepResult) -> None:
        """Mark the node online or offline as of `now`; a change is seen at once by the liveness rules."""
        off = self.offline_at(ns)
        online = off is None or now < off
        if online != ns.online:
            self.state.set_online(ns, online, off or now)
            self.evaluate_liveness(ns, now, out)

    def evaluate_liveness(self, ns: NodeState, now: datetime, out: StepResult) -> None:
        """Node rules that read `online` / `last_seen` see a node go offline (or come back) at once."""
        if self.plan.liveness_rules and ns.node_entity is not None:
            ents = (ns.node_entity,)
            for rule in self.plan.liveness_rules:
                self.evaluator.evaluate(rule, ents, now, out)

    def check_nodes(self, now: datetime, out: StepResult) -> None:
        """At a tick: every node's online state; nodes offline past the grace are forgotten, their incidents gone."""
        gone: list[str] = []
        # A node online that reported well within its last intervals stays online (and is not gone): skipped on
        # a float comparison; one near its instant (a millisecond) takes the exact check.
        quick = self.detection
        now_ts = now.timestamp() + 0.001
        after, interval = OFFLINE_AFTER_INTERVALS, self.snapshot_interval_s
        for key, ns in self.state.nodes.items():
            seen = ns.last_seen
            if quick and ns.online and not ns.stopping and seen is not None and (
                seen.timestamp() + after * (ns.interval_s or interval) > now_ts
            ):
                continue
            self.check_online(ns, now, out)
            if not ns.online and ns.offline_since is not None and (
                (now - ns.offline_since).total_seconds() >= self.offline_grace_s
            ):
                gone.append(key)
        for key in gone:
            ns = self.state.nodes[key]
            if self.liveness_open(ns):
                # An "agent down" incident is open: keep the node so that it goes on (and resolves when the node
                # is back, or as gone when it is forgotten); the incidents of other rules end as gone.
                for e in ns.entities.values():
                    self.evaluator.close_all(e, now, "gone", out, keep_liveness=True)
                ns.full_next = True  # its entities stay: when it is back, all of them are evaluated afresh
                continue
            self.forget(key, now, out)

    def forget(self, key: str, now: datetime, out: StepResult) -> None:
        """Forget the node: its entities' incidents end as gone; the jobs it held are evaluated as they are now."""
        change = self.state.remove_node(key)
        for e in change.gone:
            self.evaluator.close_all(e, now, "gone", out)
        for e in change.changed:
            for rule in self.plan.event_rules[e.kind]:
                self.evaluator.evaluate(rule, (e,), now, out)
        exempting = self.state.jobs.take_exemptions_changed()
        if exempting:  # a job gone with the node took its exemptions: its GPUs and processes elsewhere
            self.evaluator.evaluate_jobs(exempting, now, out)

    def liveness_open(self, ns: NodeState) -> bool:
        """Whether a rule that reads liveness has an open incident on the node."""
        if not self.plan.liveness_rules or ns.node_entity is None:
            return False
        return any(self.plan.by_name[n].reads_liveness for n in self.book.rules_on(ns.node_entity.key))

    def next_change(self, now: datetime) -> datetime | None:
        """The next instant a node goes offline or passes its grace, after `now`."""
        best: datetime | None = None
        for ns in self.state.nodes.values():
            off = self.offline_at(ns)
            if off is None:
                continue
            if ns.online and off > now:
                at = off
            elif not ns.online and ns.offline_since is not None:
                at = ns.offline_since + timedelta(seconds=self.offline_grace_s)
                if at <= now:
                    continue
            else:
                continue
            if best is None or at < best:
                best = at
        return best
