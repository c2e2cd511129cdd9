"""The `function` action's parameters: a NATS request to `gpuevents.fn.<name>`; runtime actions.builtin.function."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from actions.protocol import Action, ActionParams
from actions.registry import register
from gpuevents.durations import Duration


class FunctionParams(ActionParams):
    type: Literal["function"] = "function"
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")
    data: Any = None
    timeout: Duration | None = None


@register
class FunctionSpec(Action[FunctionParams]):
    type: ClassVar[str] = "function"
    params = FunctionParams
    runtime: ClassVar[str | None] = "actions.builtin.function:FunctionAction"
