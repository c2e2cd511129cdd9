"""Liveness: a node is online while it reports, offline after three missed snapshots, gone after the grace.

Missing data is not evidence: rules are not evaluated on an offline node (its incidents neither promote nor
resolve) and end as `gone` after `engine.offline_grace`. Rules that read `online` / `last_seen` are the
exception: they see a node go offline at once, and their open incident keeps the node past the grace. A node
forgotten (past its grace, or `ForgetNode`) takes its entities with it; the jobs it held a part of are rebuilt
from their other nodes and evaluated again at once.

Each node has one liveness deadline (going offline while online, passing the grace while offline), kept in a
lazy heap as the fleet reports nodes touched: neither `next_change` nor a tick's `check_nodes` walks the fleet.
"""

from __future__ import annotations

import heapq
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
        self._heap: list[tuple[datetime, str]] = []  # (deadline, node key); stale entries are dropped lazily
        self._at: dict[str, datetime] = {}  # node key -> its deadline now (see `deadline`)
        self._due: dict[str, datetime] = {}  # taken off the heap as due by `horizon`: checked at every tick
        self._horizon: datetime | None = None  # the latest instant `_due` was taken by
        self._seq: dict[str, tuple[int, NodeState]] = {}  # node key -> (order of `state.nodes`, the node)
        self._next_seq = 0
        self._latest: datetime | None = None  # the latest instant a node's online state was checked at
        self._grace = timedelta(seconds=offline_grace_s)
        self._spans: dict[float, timedelta] = {}  # snapshot interval -> the silence that makes a node offline
        self.one_pass_share = 8
        """A tick checks its due nodes in one pass over the fleet when they are more than this share of it."""

    def deadline(self, ns: NodeState) -> datetime | None:
        """The node's next liveness change: when it goes offline (online) or passes its grace (offline)."""
        off = self.offline_at(ns)
        if off is None:
            return None
        if ns.online:
            return off
        if ns.offline_since is not None:
            return ns.offline_since + self._grace
        return None

    def _sync(self) -> list[str]:
        """Take the nodes the fleet touched: new deadlines onto the heap; the touched nodes that are offline."""
        touched = self.state.take_touched()
        if not touched:
            return []
        nodes, at_of, due, seq = self.state.nodes, self._at, self._due, self._seq
        offline: list[str] = []
        for key in touched:
            ns = nodes.get(key)
            if ns is None:
                at_of.pop(key, None)
                due.pop(key, None)
                seq.pop(key, None)
                continue
            known = seq.get(key)
            if known is None or known[1] is not ns:  # new (or forgotten and back): last in `state.nodes`
                seq[key] = (self._next_seq, ns)
                self._next_seq += 1
            if not ns.online:
                offline.append(key)
            at = self.deadline(ns)
            if at == at_of.get(key):
                continue
            due.pop(key, None)
            if at is None:
                at_of.pop(key, None)
            else:
                at_of[key] = at
                heapq.heappush(self._heap, (at, key))
        return offline

    def _take_due(self, now: datetime) -> None:
        """Move the deadlines due by `now` from the heap to `_due` (all of `_due` back first if `now` is earlier
        than the instant it was taken by)."""
        heap, at_of, due = self._heap, self._at, self._due
        if self._horizon is not None and now < self._horizon:
            for key, at in due.items():
                heapq.heappush(heap, (at, key))
            due.clear()
        self._horizon = now
        popped, many = 0, len(heap) >> 3
        while heap and heap[0][0] <= now:
            if popped > many:  # much of the fleet due at once: the rest in one pass
                rest = []
                for at, key in heap:
                    if at > now:
                        rest.append((at, key))
                    elif at_of.get(key) == at:
                        due[key] = at
                heapq.heapify(rest)
                self._heap = heap = rest
                break
            at, key = heapq.heappop(heap)
            popped += 1
            if at_of.get(key) == at:
                due[key] = at
        if len(heap) > 64 and len(heap) > 4 * len(at_of):  # mostly stale: rebuild
            self._heap = [(at, key) for key, at in at_of.items() if key not in due]
            heapq.heapify(self._heap)

    def offline_at(self, ns: NodeState) -> datetime | None:
        """When the node counts as offline (at once for an agent that said it stops); None: never."""
        if ns.stopping:
            return ns.last_seen
        if not self.detection or ns.last_seen is None:
            return None
        interval = ns.interval_s or self.snapshot_interval_s
        span = self._spans.get(interval)
        if span is None:
            span = self._spans[interval] = timedelta(seconds=OFFLINE_AFTER_INTERVALS * interval)
        return ns.last_seen + span

    def check_online(self, ns: NodeState, now: datetime, out: StepResult) -> None:
        """Mark the node online or offline as of `now`; a change is seen at once by the liveness rules."""
        if self._latest is None or now > self._latest:
            self._latest = now
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
        """At a tick: every node's online state; nodes offline past the grace are forgotten, their incidents gone.

        Only the nodes whose deadline is due, or that are offline and reported since the last tick, can change:
        those are checked, in the fleet's order, as a walk over every node would (in one pass over the fleet when
        they are more than `1 / one_pass_share` of it). A clock that went back since the last check (a node that
        went offline could be online again) walks them all."""
        offline = self._sync()
        if self._latest is not None and now < self._latest:
            self.walk_check_nodes(now, out)
        else:
            self._take_due(now)
            keys = set(self._due)
            keys.update(offline)
            nodes = self.state.nodes
            if len(keys) * self.one_pass_share > len(nodes):  # much of the fleet (say all going offline)
                self._check({k: ns for k, ns in nodes.items() if k in keys}, now, out)
            elif keys:
                seq = self._seq
                self._check({k: nodes[k] for k in sorted(keys, key=lambda k: seq[k][0])}, now, out)
        if self._latest is None or now > self._latest:
            self._latest = now
        self._sync()

    def walk_check_nodes(self, now: datetime, out: StepResult) -> None:
        """`check_nodes` by a walk over every node (the reference the heap is tested against)."""
        self._check(self.state.nodes, now, out)
        if self._latest is None or now > self._latest:
            self._latest = now

    def _check(self, nodes: dict[str, NodeState], now: datetime, out: StepResult) -> None:
        """`check_nodes` over these nodes (in the fleet's order)."""
        gone: list[str] = []
        # A node online that reported well within its last intervals stays online (and is not gone): skipped on
        # a float comparison; one near its instant (a millisecond) takes the exact check.
        quick = self.detection
        now_ts = now.timestamp() + 0.001
        after, interval = OFFLINE_AFTER_INTERVALS, self.snapshot_interval_s
        for key, ns in nodes.items():
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
                ns.skipped()  # its entities stay: when it is back, all of them are evaluated afresh
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
        """The next instant a node goes offline or passes its grace, after `now` (those due by `now` are left to
        the next tick's `check_nodes`)."""
        self._sync()
        self._take_due(now)
        heap, at_of = self._heap, self._at
        while heap:
            at, key = heap[0]
            if at_of.get(key) == at:
                return at
            heapq.heappop(heap)
        return None

    def walk_next_change(self, now: datetime) -> datetime | None:
        """`next_change` by a walk over every node (the reference the heap is tested against)."""
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
