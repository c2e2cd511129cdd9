"""What `pause` changes on a workload, by how its kind is stopped, and what `resume` sets back: field changes
with the value before and after, as JSON merge patches. Pure: objects in, changes out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from gpuevents.kubekinds import NOTEBOOK_STOP_ANNOTATION, Kind

#: a field that is absent (a merge patch with null removes it)
ABSENT: None = None


class Change(BaseModel):
    """One field: its path in the object, the value pause found (None: absent) and the one it set."""

    path: list[str]
    before: Any = None
    after: Any = None


def get_path(obj: Mapping[str, Any], path: Sequence[str]) -> Any:
    cur: Any = obj
    for p in path:
        if not isinstance(cur, Mapping) or p not in cur:
            return ABSENT
        cur = cur[p]
    return cur


def merge_patch(values: Sequence[tuple[Sequence[str], Any]]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386) setting each path to its value (None removes the field)."""
    out: dict[str, Any] = {}
    for path, value in values:
        cur = out
        for p in path[:-1]:
            cur = cur.setdefault(p, {})
        cur[path[-1]] = value
    return out


def _replicas_default(kind: Kind) -> int:
    return 1  # Deployment, StatefulSet, ReplicaSet and LeaderWorkerSet all default spec.replicas to 1


def pause_changes(kind: Kind, obj: Mapping[str, Any], now: str) -> list[Change]:
    """The changes that stop this object the way its kind is stopped; empty when it is stopped already.
    `now` (RFC 3339) is the Notebook's stop annotation value. A kind with no way to pause raises ValueError."""
    if kind.pause == "replicas":
        path = ["spec", "replicas"]
        current = get_path(obj, path)
        if (current if current is not None else _replicas_default(kind)) == 0:
            return []
        return [Change(path=path, before=current, after=0)]
    if kind.pause in ("suspend", "run_policy"):
        path = ["spec", "suspend"] if kind.pause == "suspend" else ["spec", "runPolicy", "suspend"]
        current = get_path(obj, path)
        return [] if current is True else [Change(path=path, before=current, after=True)]
    if kind.pause == "stop_annotation":
        path = ["metadata", "annotations", NOTEBOOK_STOP_ANNOTATION]
        current = get_path(obj, path)
        return [] if current is not None else [Change(path=path, before=None, after=now)]
    if kind.pause == "min_replicas":
        path = ["spec", "predictor", "minReplicas"]
        current = get_path(obj, path)
        return [] if current == 0 else [Change(path=path, before=current, after=0)]
    raise ValueError(f"{kind.kind} has no way to be paused")


def resume_changes(changes: Sequence[Change], obj: Mapping[str, Any]) -> tuple[list[Change], list[str]]:
    """The changes to undo (each field still holding what pause set), and what was left because someone
    changed it since (a person scaled it back up, or edited it): never overwritten."""
    undo: list[Change] = []
    left: list[str] = []
    for c in changes:
        current = get_path(obj, c.path)
        if current == c.after:
            undo.append(Change(path=c.path, before=c.after, after=c.before))
        elif current != c.before:
            left.append(f"{'.'.join(c.path)} is {current!r} now (pause set {c.after!r}): left as it is")
    return undo, left


def describe(changes: Sequence[Change]) -> str:
    def show(v: Any) -> str:
        return "absent" if v is None else repr(v) if isinstance(v, str) else str(v).lower() if isinstance(
            v, bool) else str(v)

    return ", ".join(f"{'.'.join(c.path)} {show(c.before)} -> {show(c.after)}" for c in changes)
