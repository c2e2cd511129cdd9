"""The `pause` and `resume` actions' parameters: stop a Kubernetes job's top owner the way its kind is stopped,
and set back exactly what was changed; runtime actions.builtin.pause."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field

from actions.protocol import Action, ActionParams
from actions.registry import register
from gpuevents.durations import Duration


class PauseParams(ActionParams):
    type: Literal["pause"] = "pause"
    job: str | None = Field(default=None, description="<namespace>/<Kind>/<name>; default: the entity's job")
    reason: str | None = Field(default=None, description="said in the Event on the workload")
    timeout: Duration | None = None


class ResumeParams(ActionParams):
    type: Literal["resume"] = "resume"
    job: str | None = Field(default=None, description="<namespace>/<Kind>/<name>; default: the entity's job")
    timeout: Duration | None = None


@register
class PauseSpec(Action[PauseParams]):
    type: ClassVar[str] = "pause"
    params = PauseParams  # every kind: a job, a gpu's or process's job, any entity with `job:` (a schedule)
    destructive: ClassVar[bool] = True
    runtime: ClassVar[str | None] = "actions.builtin.pause:PauseAction"


@register
class ResumeSpec(Action[ResumeParams]):
    type: ClassVar[str] = "resume"
    params = ResumeParams
    runtime: ClassVar[str | None] = "actions.builtin.pause:ResumeAction"

    @classmethod
    def restores(cls, params: Mapping[str, Any]) -> bool:
        return True  # it sets back what a pause changed
