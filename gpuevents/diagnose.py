"""The site's GPU diagnostic run by a node's agent (the `diagnose` command, DESIGN §5): its configuration
(`agent.diagnostics`), the command and reply on `gpuevents.cmd.<cluster>.<node>.diagnose`, and the result the
agent reports in its node's snapshots (`node.diag_status`, `node.diag_passed_at`, ...).

What runs is only ever the argv of the agent's own configuration (e.g. `[dcgmi, diag, -r, "2"]`), started
without a shell. The command carries no program, argument or text that could reach it: a command with any
field beyond `rule` and `key` is refused.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuevents.durations import Duration

DIAGNOSE_VERB = "diagnose"

DiagStatus = Literal["running", "passed", "failed"]
DiagnoseOutcome = Literal["started", "running", "refused"]


class AgentDiagnosticsConfig(BaseModel):
    """`agent.diagnostics`: the site's diagnostic, run on a `diagnose` command; unset `argv` refuses them."""

    model_config = ConfigDict(extra="forbid", frozen=True)  # as every section of gpuevents/config.py

    argv: list[str] | None = Field(None, min_length=1, description="program and arguments, run without a shell "
                                   "(e.g. [dcgmi, diag, -r, '2']); exit status 0 is a pass")
    timeout: Duration = Field(1800.0, gt=0, description="a run still going after this is killed and failed")
    output_tail: int = Field(2000, ge=0, le=65536, description="characters of its output kept with the result")


class DiagnoseCommand(BaseModel):
    """Ask the agent to run its configured diagnostic once. Nothing in it reaches the diagnostic: `rule` and
    `key` only name who asked, in the agent's log."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: str = Field("", max_length=200)
    key: str | None = Field(None, max_length=400)


class DiagnoseReply(BaseModel):
    """`started` (the result comes in the node's snapshots), `running` (one already runs: its result counts)
    or `refused` with the reason."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    outcome: DiagnoseOutcome
    reason: str = ""
    started_at: datetime | None = None


class DiagResult(BaseModel):
    """The diagnostic's latest run as the node's snapshots carry it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    status: DiagStatus
    started_at: datetime
    finished_at: datetime | None = None
    exit_code: int | None = None
    output: str = ""
    passed_at: datetime | None = None  # the end of the latest run that passed, this one or an earlier one
    failed_at: datetime | None = None  # the end of the latest run that failed
