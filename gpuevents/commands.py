"""Commands to a node's agent (DESIGN §5): the request and reply models shared by actions and agent.

The kill action sends one `KillCommand` per process as a NATS request to
`gpuevents.subjects.command_subject(cluster, node, "kill")`; the agent answers with one `KillReply`.
Both are JSON on the wire (`model_dump_json` / `model_validate_json`).

Where the kill action finds its targets: the engine puts the entity's processes into
`ActionRequest.facts.processes` (gpuevents/facts.py), each with at least `pid` and `create_time`
(the process start time the agent reported). For a process entity the list has that one process
(a single `facts.process` is accepted too); for a gpu entity it has every process on that GPU.
`kill_targets(facts)` reads them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuevents.facts import Facts

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
    """One process the kill action will ask an agent to end: a process of the request's facts that names
    itself enough to be signalled (a `pid` and the `create_time` the agent reported)."""

    model_config = ConfigDict(extra="ignore", frozen=True, from_attributes=True)

    pid: int = Field(gt=0)
    create_time: datetime
    user: str | None = None
    name: str | None = None
    node: str | None = None


def kill_targets(facts: Facts) -> list[KillTarget]:
    """The processes named in an action request's facts (`processes`, else the one `process`); a
    ValidationError where one lacks its pid or create time."""
    procs = facts.processes or ([facts.process] if facts.process is not None else [])
    return [KillTarget.model_validate(p) for p in procs]


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
