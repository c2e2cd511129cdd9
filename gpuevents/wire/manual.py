"""A person's remedy or its undo (`gpuevents kill|cancel|pause|resume|cordon|uncordon`): the request the CLI sends
to the acting engine on `gpuevents.engine.act` and the engine's answer, one model for both ends (DESIGN §6, §7.1).

The operator's login may not command agents; the engine decides the request like a rule's action (protection,
engine.limits, engine.dry_run), audits it under the rule name `operator`, and hands it to the runners.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuevents.commands import Signal
from gpuevents.records import Decision

OPERATOR_RULE = "operator"
"""The rule name a person's actions are audited and rate-limited under."""

OperatorType = Literal["kill", "cancel", "pause", "resume", "cordon", "uncordon"]
RESTORES: frozenset[str] = frozenset({"resume", "uncordon"})
"""Undoing what a remedy did: never limited or held (DESIGN §3.4), and possible for a target the engine no longer
sees (a paused workload has no pods; the runner works from what the remedy wrote on the object)."""
_JOB_ID = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z][A-Za-z0-9]*/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


class OperatorAction(BaseModel):
    """Kill one process (`node`, `pid`), cancel one job (`job`), pause or resume a Kubernetes workload (`job`:
    namespace/Kind/name), cordon or uncordon a node (`node`); asked by `by` for `reason`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: OperatorType
    cluster: str = Field(min_length=1)
    node: str | None = Field(None, min_length=1, description="kill: the process's node; cordon, uncordon: the node")
    pid: int | None = Field(None, gt=0, description="kill: the process id on that node")
    job: str | None = Field(None, min_length=1, description="cancel: the job id (Slurm) or namespace/pod; pause, "
                            "resume: namespace/Kind/name")
    provider: Literal["kubernetes", "slurm"] = Field("kubernetes", description="cordon, uncordon: through what")
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
        if self.type in ("pause", "resume") and (self.job is None or re.match(_JOB_ID, self.job) is None):
            raise ValueError(f"{self.type} needs the workload as namespace/Kind/name (e.g. ml/Deployment/trainer), "
                             f"not {self.job!r}")
        if self.type in ("cordon", "uncordon") and self.node is None:
            raise ValueError(f"{self.type} needs the node")
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
