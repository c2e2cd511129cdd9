"""Entity state: the latest node, GPU and process views, updated from snapshots and threshold events.

`fleet` applies events to the per-node state of `node`; `rebuild` builds a node's views and entities from
its infos, keeping those whose inputs did not change.
"""

from rules.core.state.fleet import CREATE_TIME_TOLERANCE_S, FleetState
from rules.core.state.node import Change, Entity, NodeState

__all__ = ["CREATE_TIME_TOLERANCE_S", "Change", "Entity", "FleetState", "NodeState"]
