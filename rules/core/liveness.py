"""Liveness: a node is online while it reports, offline after three missed snapshots, gone after the grace.

Missing data is not evidence: rules are not evaluated on an offline node (its incidents neither promote nor
resolve) and end as `gone` after `engine.offline_grace`. Rules that read `online` / `last_seen` are the
exception: they see a node go offline at once, and their open incident keeps the node past the grace.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from rules.core.evaluation import close, close_all, evaluate
from rules.core.inputs import StepResult
from rules.core.state import NodeState

if TYPE_CHECKING:
    from rules.core.core import Core

OFFLINE_AFTER_INTERVALS = 3
"""A node is offline once this many snapshot intervals passed without a word from it."""


def offline_at(core: Core, ns: NodeState) -> datetime | None:
    """When the node counts as offline (at once for an agent that said it stops); None: never."""
    if not core.offline_detection and not ns.stopping:
        return None
    if ns.stopping:
        return ns.last_seen
    if ns.last_seen is None:
        return None
    interval = ns.interval_s or core.snapshot_interval_s
    return ns.last_seen + timedelta(seconds=OFFLINE_AFTER_INTERVALS * interval)


def check_online(core: Core, ns: NodeState, now: datetime, out: StepResult) -> None:
    """Mark the node online or offline as of `now`; a change is seen at once by the liveness rules."""
    off = offline_at(core, ns)
    online = off is None or now < off
    if online != ns.online:
        core.state.set_online(ns, online, off or now)
        evaluate_liveness(core, ns, now, out)


def evaluate_liveness(core: Core, ns: NodeState, now: datetime, out: StepResult) -> None:
    """Node rules that read `online` / `last_seen` see a node go offline (or come back) at once."""
    if core.liveness_rules and ns.node_entity is not None:
        ents = (ns.node_entity,)
        for rule in core.liveness_rules:
            evaluate(core, rule, ents, now, out)


def check_nodes(core: Core, now: datetime, out: StepResult) -> None:
    """At a tick: every node's online state; nodes offline past the grace are forgotten, their incidents gone."""
    gone: list[str] = []
    for key, ns in core.state.nodes.items():
        check_online(core, ns, now, out)
        if not ns.online and ns.offline_since is not None and (
            (now - ns.offline_since).total_seconds() >= core.offline_grace_s
        ):
            gone.append(key)
    for key in gone:
        ns = core.state.nodes[key]
        if liveness_open(core, ns):
            # An "agent down" incident is open: keep the node so that it goes on (and resolves when the node
            # is back, or as gone when it is forgotten); the incidents of other rules end as gone.
            for e in [*ns.entities.values(), *([ns.node_entity] if ns.node_entity is not None else [])]:
                for name in list(core.by_entity.get(e.key, ())):
                    rule = core.rules.by_name[name]
                    if not rule.reads_liveness:
                        close(core, rule, e.key, e, now, "gone", out)
            continue
        for e in core.state.remove_node(key):
            close_all(core, e, now, "gone", out)


def liveness_open(core: Core, ns: NodeState) -> bool:
    """Whether a rule that reads liveness has an open incident on the node."""
    if not core.liveness_rules or ns.node_entity is None:
        return False
    names = core.by_entity.get(ns.node_entity.key, ())
    return any(core.rules.by_name[n].reads_liveness for n in names)
