"""Commands to a node's agent (DESIGN §5): the request and reply models shared by actions and agent.

The kill action sends one `KillCommand` per process as a NATS request to
`gpuevents.subjects.command_subject(cluster, node, "kill")`; the agent answers with one `KillReply`.
Both are JSON on the wire (`model_dump_json` / `model_validate_json`).

Where the kill action finds its targets: the engine puts the entity's processes into
`ActionRequest.facts["processes"]`, a list of objects with at least `pid`, `create_time`
(RFC 3339, the process start time the agent reported), and, for messages and protection,
`user` and `name` — the same fields as `gpuevents.events.ProcessInfo`. For a process entity the
list has that one process (a single `facts["process"]` object is accepted too); for a gpu entity
it has every process on that GPU. `kill_targets(facts)` reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

KILL_VERB = "kill"
POWER_CAP_VERB = "power_cap"

Signal = Literal["TERM", "INT", "HUP", "QUIT", "KILL", "USR1", "USR2"]
KillOutcome = Literal["killed", "exited", "gone", "refused"]

# Process start times from psutil are floats rounded differently on each read; agents compare
# the requested create_time with the live one within this many seconds.
CREATE_TIME_TOLERANCE_S = 1.0

KILL_WAIT_S = 10.0
"""How long the agent waits for a process to end after SIGKILL before it answers anyway; the kill action
waits the grace plus this (plus a margin) for each answer."""


class KillCommand(BaseModel):
    """Ask the agent to end one process: `signal`, then SIGKILL if it is still alive after `grace_s`.

    The agent checks, before signalling anything, that `pid` is alive with the same `create_time`
    (else `gone` when no such pid lives, `refused` "create time differs" when the pid was reused by
    another process), that it is not pid 1, not protected
    (config `protect`), and still holds a GPU (else `refused` with the reason).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    pid: int = Field(gt=0)
    create_time: datetime
    signal: Signal = "TERM"
    grace_s: float = Field(default=30, ge=0, description="seconds between `signal` and SIGKILL")
    reason: str = ""
    rule: str = ""
    key: str | None = Field(default=None, description="the action's idempotency key, for the agent's log")
    require_gpu: bool = Field(default=True, description="refuse a process that holds no GPU any more")


class KillReply(BaseModel):
    """The agent's answer to a `KillCommand`.

    - `exited`: it ended within `grace_s` after `signal`.
    - `killed`: it outlived the grace and ended after SIGKILL.
    - `gone`: no process with that pid any more; nothing was signalled.
    - `refused`: the agent would not signal it (pid 1, protected user or name, no GPU held,
      the agent's own rate limit); `reason` says which.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    outcome: KillOutcome
    pid: int
    reason: str = ""
    signal: Signal | None = Field(default=None, description="the last signal sent, if any")
    user: str | None = None
    name: str | None = None


class KillTarget(BaseModel):
    """One process the kill action will ask an agent to end, as read from `ActionRequest.facts`."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    pid: int = Field(gt=0)
    create_time: datetime
    user: str | None = None
    name: str = ""
    node: str | None = None


def kill_targets(facts: Mapping[str, Any]) -> list[KillTarget]:
    """The processes named in an action request's facts (`processes` list, else one `process`)."""
    raw = facts.get("processes")
    if raw is None:
        one = facts.get("process")
        raw = [one] if one is not None else []
    if not isinstance(raw, list):
        raise ValueError("facts.processes must be a list of {pid, create_time, user, name}")
    return [KillTarget.model_validate(p) for p in raw]


PowerCapOutcome = Literal["capped", "restored", "unchanged", "refused"]


class PowerCapCommand(BaseModel):
    """Ask the agent to lower one GPU's power limit while it is held idle (`restore`: put it back).

    The agent checks, before touching the limit, that the GPU at `index` is still `uuid`, is a whole GPU (a MIG
    instance shares its GPU's limit), is idle in its latest sample, and is held by exactly the `processes` named
    (pid and create time, as for kill), none of them protected; `watts` (None: the GPU's minimum) is raised to
    the GPU's own minimum. The limit comes back on activity, when a holder ends, on `restore`, and when the agent
    stops or starts again."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    index: int = Field(ge=0)
    uuid: str = ""
    watts: float | None = Field(default=None, gt=0)
    processes: list[KillTarget] = Field(default_factory=list)
    restore: bool = False
    rule: str = ""
    key: str | None = None


class PowerCapReply(BaseModel):
    """`capped` (or, dry-run, would be), `restored`, `unchanged` (nothing to do) or `refused` with the reason."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    outcome: PowerCapOutcome
    index: int
    reason: str = ""
    limit_w: float | None = None  # the limit now
    previous_w: float | None = None  # the limit before this command
    dry_run: bool = False
