"""The `command` action's parameters: an argv list (never a shell) with a timeout; runtime actions.builtin.command."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from actions.protocol import Action, ActionParams
from actions.registry import register
from gpuevents.durations import Duration


class CommandParams(ActionParams):
    type: Literal["command"] = "command"
    argv: list[str] = Field(min_length=1, description="program and arguments; each a template")
    timeout: Duration | None = None
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    ok_codes: list[int] = Field(default_factory=lambda: [0])


@register
class CommandSpec(Action[CommandParams]):
    type: ClassVar[str] = "command"
    params = CommandParams
    destructive: ClassVar[bool] = True
    runtime: ClassVar[str | None] = "actions.builtin.command:CommandAction"
