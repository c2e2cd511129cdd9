"""The `cancel` action's parameters: end a scheduler job (Slurm scancel/requeue, a Kubernetes pod);
runtime actions.builtin.cancel."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from actions.protocol import Action, ActionParams
from actions.registry import register
from gpuevents.durations import Duration
from gpuevents.records import EntityKind


class CancelParams(ActionParams):
    type: Literal["cancel"] = "cancel"
    provider: Literal["slurm", "kubernetes"] = "slurm"
    job: str | None = Field(default=None, description="the job id (Slurm) or namespace/pod (Kubernetes); "
                            "default: the entity's job from the request's facts")
    signal: str | None = Field(default=None, description="Slurm: send this signal instead of ending the job")
    requeue: bool = Field(default=False, description="Slurm: put the job back in the queue (scontrol requeue)")
    timeout: Duration | None = None


@register
class CancelSpec(Action[CancelParams]):
    type: ClassVar[str] = "cancel"
    params = CancelParams
    entity_kinds: ClassVar[frozenset[EntityKind]] = frozenset({"gpu", "process", "job"})
    destructive: ClassVar[bool] = True
    runtime: ClassVar[str | None] = "actions.builtin.cancel:CancelAction"
