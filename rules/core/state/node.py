"""Per-node state: the infos a node reported, and the views and entities built from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuevents.agentdata import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo
from rules.lang.views import GpuView


@dataclass(eq=False, slots=True)
class Entity:
    """One evaluable entity: its key (unique, a process's includes its create time), id, and context."""

    key: str
    id: str
    kind: str
    node_key: str
    view: Any
    ctx: dict[str, Any]


@dataclass(eq=False, slots=True)
class NodeState:
    """Everything known about one node; views are rebuilt from the infos whenever one changes."""

    key: str
    name: str
    cluster: str
    info: NodeInfo
    gpu_infos: dict[int, GpuInfo] = field(default_factory=dict)
    proc_infos: dict[str, ProcessInfo] = field(default_factory=dict)  # by entity key
    entities: dict[str, Entity] = field(default_factory=dict)
    node_entity: Entity | None = None
    last_seen: datetime | None = None
    interval_s: float | None = None
    online: bool = True
    offline_since: datetime | None = None
    stopping: bool = False
    _full_next: bool = False  # rebuild every view and report every entity next time (the core skipped one)
    node_sig: tuple[Any, ...] = ()  # the node's own fields and online state its views were built with
    view_gpu_infos: dict[int, GpuInfo] = field(default_factory=dict)  # the infos the views show now
    view_proc_infos: dict[str, ProcessInfo] = field(default_factory=dict)
    gpu_views: list[GpuView] = field(default_factory=list)
    snap_valid: bool = False  # `snapshot` holds the node's inputs: no other event changed them since
    snap_time: datetime | None = None  # the time of `snapshot` (a GPU's idle start may be derived from it)
    snap_timed: bool = False  # the snapshot's inputs depend on its time (see `rebuild.timed`)
    snapshot: NodeSnapshot | None = None  # the snapshot the views were built from (kept while repeated)
    xids: dict[int, tuple[int, datetime]] = field(default_factory=dict)  # GPU index -> its last XID and when

    @property
    def full_next(self) -> bool:
        """Whether its views are rebuilt, and every entity reported, at the next rebuild."""
        return self._full_next

    def skipped(self) -> None:
        """The core left the node's entities unevaluated (offline): evaluate every one when it is back."""
        self._full_next = True

    def take_full(self) -> bool:
        """Whether the next rebuild is full, as the rebuild takes it (clearing the mark)."""
        full, self._full_next = self._full_next, False
        return full


@dataclass(slots=True)
class Change:
    """What an event changed: entities to evaluate, entities that are gone, and for each changed entity that is
    not new the names of the fields its context shows that changed (no entry: evaluate every rule)."""

    node_key: str
    changed: list[Entity]
    gone: list[Entity]
    deltas: dict[str, frozenset[str]] = field(default_factory=dict)
