"""Defence in depth: whether config `protect` forbids a destructive action on this entity."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuevents.config import ProtectConfig
from gpuevents.records import ActionRequest


class _ProcessFacts(BaseModel):
    model_config = ConfigDict(extra="ignore")
    pid: int | None = None
    user: str | None = None
    name: str | None = None
    pod: str | None = None


class _NodeFacts(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class _ProtectFacts(BaseModel):
    model_config = ConfigDict(extra="ignore")
    node: _NodeFacts = _NodeFacts()
    process: _ProcessFacts | None = None
    processes: list[_ProcessFacts] = Field(default_factory=list)

    @field_validator("node", mode="before")
    @classmethod
    def _node(cls, v: Any) -> Any:
        return {} if v is None else v


def protection_reason(request: ActionRequest, protect: ProtectConfig) -> str | None:
    """Why this destructive action must not touch this entity (`user root (pid 7)`,
    `node label tier=prod`, …), or None.

    Node labels protect everything on the node. Users, process names and namespaces protect
    processes: from `kill`, every process it would signal (all of a GPU's); from other
    destructive actions, the entity itself when it is a process (cordoning a node is not
    refused because a protected user also has a process on it).
    """
    facts = _ProtectFacts.model_validate(request.facts)
    for key, value in protect.node_labels.items():
        if facts.node.labels.get(key) == value:
            return f"node label {key}={value}"
    procs: list[_ProcessFacts] = []
    if request.type == "kill":
        procs.extend(facts.processes)
    if facts.process is not None:
        procs.append(facts.process)
    users = set(protect.users)
    for p in procs:
        if p.user is not None and p.user in users:
            return f"user {p.user} (pid {p.pid})"
        for pattern in protect.process_patterns:
            if p.name and fnmatchcase(p.name, pattern):
                return f"process name {p.name!r} matches {pattern!r}"
        if p.pod and "/" in p.pod and p.pod.split("/", 1)[0] in protect.namespaces:
            return f"namespace {p.pod.split('/', 1)[0]} (pod {p.pod})"
    return None
