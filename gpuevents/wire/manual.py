"""A person's kill or cancel (`gpuevents kill`, `gpuevents cancel`): the request the CLI sends to the acting engine on
`gpuevents.engine.act` and the engine's answer, one model for both ends (DESIGN §7.1).

The operator's login may not command agents; the engine decides the request like a rule's action (protection,
engine.limits, engine.dry_run), audits it under the rule name `operator`, and hands it to the runners.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuevents.commands import Signal
from gpuevents.records import Decision

OPERATOR_RULE = "operator"
"""The rule name a person's actions are audited and rate-limited under."""


class OperatorAction(BaseModel):
    """Kill one process (`node`, `pid`) or cancel one job (`job`), asked by `by` for `reason`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["kill", "cancel"]
    cluster: str = Field(min_length=1)
    node: str | None = Field(None, min_length=1, description="kill: the process's node")
    pid: int | None = Field(None, gt=0, description="kill: the process id on that node")
    job: str | None = Field(None, min_length=1, description="cancel: the job id (Slurm) or namespace/pod")
    signal: Signal = "TERM"
    grace: float = Field(30.0, ge=0, le=600)
    reason: str = Field("", max_length=500)
    by: str = Field(min_length=1, max_length=100)

    @model_validator(mode="after")
    def _target(self) -> OperatorAction:
        if self.type == "kill" and (self.node is None or self.pid is None):
            raise ValueError("kill needs the node and the pid")
        if self.type == "cancel" and self.job is None:
            raise ValueError("cancel needs the job")
        return self


class OperatorActionReply(BaseModel):
    """What the engine decided: `run` (handed to the runners), `dry_run`, `refused`, `suppressed`, `held`; or an
    `error` (unknown process or job, a malformed request)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    ok: bool
    decision: Decision | None = None
    reason: str | None = None
    key: str | None = Field(None, description="the action's key, as `gpuevents audit` shows it")
    entity_id: str | None = None
    error: str | None = None
