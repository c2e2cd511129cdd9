"""Held idle, defined once: the GPU somebody holds and nobody uses. Status, the dashboard, the usage rollups and
reports, the rules (`gpu.held_idle`) and the `gpuevents_held_idle_gpus` gauge all ask this module.

A GPU is *held* when a process sits on it, an owner is named for it, or a scheduler allocated it to a job (DESIGN
§2: allocated with nothing running is the most wasted GPU there is). It is *held idle* when it is held and idle,
and its reading is one to count: not lost, not on a node that is offline (the reading is stale; the usage
rollups count no hours for an outage either), and not a MIG parent whose instances are reported (they are its
parts and are counted themselves)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol


class Holdable(Protocol):
    """What the definition reads of a GPU (read-only, so frozen readings and the rules' views both match)."""

    @property
    def idle(self) -> bool: ...
    @property
    def lost(self) -> bool: ...
    @property
    def pids(self) -> Sequence[int]: ...
    @property
    def owners(self) -> Sequence[str]: ...
    @property
    def allocated(self) -> bool | None: ...


class _Parted(Protocol):
    @property
    def uuid(self) -> str: ...
    @property
    def mig_parent(self) -> str | None: ...


class _HeldPart(Holdable, _Parted, Protocol):
    """A GPU with its place in a MIG layout."""


def held(gpu: Holdable) -> bool:
    """Somebody holds it: a process on it, an owner named for it, or a scheduler's allocation."""
    return bool(gpu.pids or gpu.owners or gpu.allocated)


def held_idle(gpu: Holdable, *, parted: bool = False, online: bool = True) -> bool:
    """Held and idle, on an `online` node, not lost, not `parted` (a MIG parent whose instances are reported)."""
    return online and gpu.idle and not gpu.lost and not parted and held(gpu)


def parted_uuids(gpus: Iterable[_Parted]) -> frozenset[str]:
    """The uuids of the MIG parents among one node's GPUs whose instances are reported."""
    return frozenset(g.mig_parent for g in gpus if g.mig_parent)


def count_held_idle(gpus: Iterable[_HeldPart], *, online: bool = True) -> int:
    """How many of one node's GPUs are held idle."""
    if not online:
        return 0
    gpus = list(gpus)
    parents = parted_uuids(gpus)
    return sum(1 for g in gpus if held_idle(g, parted=g.uuid in parents))
