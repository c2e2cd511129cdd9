"""What `pause` changes on a workload, by how its kind is stopped, and what `resume` sets back: field changes
with the value before and after, as JSON merge patches. Pure: objects in, changes out.

What a pause changed is also written on the paused object itself, as the annotation `gpuevents.io/paused` (the
record below as JSON: each object's previous values, the rule, when), so `resume` works from the cluster alone
when the engine's store is gone; `gpuevents.io/paused-by` says who and when at a glance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from gpuevents.kubekinds import NOTEBOOK_STOP_ANNOTATION, Kind

#: a field that is absent (a merge patch with null removes it)
ABSENT: None = None
PAUSED_BY = "gpuevents.io/paused-by"
PAUSED = "gpuevents.io/paused"


class Change(BaseModel):
    """One field: its path in the object, the value pause found (None: absent) and the one it set."""

    path: list[str]
    before: Any = None
    after: Any = None


class Paused(BaseModel):
    """What one pause changed on one object: resume sets exactly this back."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str
    changes: list[Change]


class PauseRecord(BaseModel):
    job: str
    rule: str
    at: str
    objects: list[Paused]


def with_annotation(record: PauseRecord, current: str | None) -> PauseRecord:
    """`record` with its own JSON written on its first object (`current`: the annotation there now)."""
    if not record.objects:
        return record
    first = record.objects[0]
    change = Change(path=["metadata", "annotations", PAUSED], before=current, after=record.model_dump_json())
    return record.model_copy(update={"objects": [first.model_copy(update={"changes": [*first.changes, change]}),
                                                 *record.objects[1:]]})


def record_on(obj: Mapping[str, Any]) -> PauseRecord | None:
    """The pause record written on `obj` (None: none, or not readable), with the annotation itself among the
    changes to undo, so resume removes it."""
    raw = get_path(obj, ["metadata", "annotations", PAUSED])
    if not isinstance(raw, str):
        return None
    try:
        record = PauseRecord.model_validate_json(raw)
    except ValidationError:
        return None
    uid = get_path(obj, ["metadata", "uid"])
    for i, o in enumerate(record.objects):
        if o.uid == uid:
            change = Change(path=["metadata", "annotations", PAUSED], before=None, after=raw)
            record.objects[i] = o.model_copy(update={"changes": [*o.changes, change]})
            return record
    return None


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

    return ", ".join(f"{'.'.join(c.path)} {show(c.before)} -> {show(c.after)}" for c in changes
                     if c.path[:2] != ["metadata", "annotations"] or not c.path[-1].startswith("gpuevents.io/"))
