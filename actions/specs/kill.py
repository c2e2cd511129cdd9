"""The `kill` action's parameters: signal a process, or every process on a GPU, through the node's agent;
runtime actions.builtin.kill."""

from __future__ import annotations

from typing import ClassVar, Literal

from actions.protocol import Action, ActionParams
from actions.registry import register
from gpuevents.commands import Signal
from gpuevents.durations import Duration
from gpuevents.records import EntityKind


class KillParams(ActionParams):
    type: Literal["kill"] = "kill"
    signal: Signal = "TERM"
    grace: Duration = 30
    reason: str = ""


@register
class KillSpec(Action[KillParams]):
    type: ClassVar[str] = "kill"
    params = KillParams
    entity_kinds: ClassVar[frozenset[EntityKind]] = frozenset({"process", "gpu"})
    destructive: ClassVar[bool] = True
    runtime: ClassVar[str | None] = "actions.builtin.kill:KillAction"
