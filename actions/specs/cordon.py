"""The `cordon` and `uncordon` actions' parameters: a node (un)schedulable through Kubernetes, Slurm or a command;
runtime actions.builtin.cordon."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import Field, model_validator

from actions.escaping import no_escape, single_node
from actions.protocol import Action, ActionParams
from actions.registry import register
from gpuevents.durations import Duration
from gpuevents.records import ActionUnit, EntityKind


class NodeParams(ActionParams):
    provider: Literal["kubernetes", "slurm", "command"] = "kubernetes"
    node: str | None = Field(default=None, description="default: the entity's node")
    reason: str | None = None
    argv: list[str] | None = Field(default=None, description="provider command: the argv to run")
    timeout: Duration | None = None

    @model_validator(mode="after")
    def _argv_for_command(self) -> NodeParams:
        if self.provider == "command" and not self.argv:
            raise ValueError("provider 'command' needs `argv`, a list: program and arguments")
        if self.provider != "command" and self.argv:
            raise ValueError(f"`argv` is for provider 'command', not {self.provider!r}")
        return self


class CordonParams(NodeParams):
    type: Literal["cordon"] = "cordon"


class UncordonParams(NodeParams):
    type: Literal["uncordon"] = "uncordon"
    force: bool = Field(default=False, description="also uncordon a node that gpuevents did not cordon")


NP = TypeVar("NP", bound=NodeParams)


class _NodeAction(Action[NP]):
    entity_kinds: ClassVar[frozenset[EntityKind]] = frozenset({"node", "gpu"})
    unit: ClassVar[ActionUnit] = "node"  # its fleet share counts nodes

    @classmethod
    def escape_at(cls, path: tuple[str | int, ...]) -> Callable[[str], str]:
        return single_node if path == ("node",) else no_escape  # `argv`: registry.escape_for checks it


@register
class CordonSpec(_NodeAction[CordonParams]):
    type: ClassVar[str] = "cordon"
    params = CordonParams
    destructive: ClassVar[bool] = True
    runtime: ClassVar[str | None] = "actions.builtin.cordon:CordonAction"


@register
class UncordonSpec(_NodeAction[UncordonParams]):
    type: ClassVar[str] = "uncordon"
    params = UncordonParams
    runtime: ClassVar[str | None] = "actions.builtin.cordon:UncordonAction"

    @classmethod
    def restores(cls, params: Mapping[str, Any]) -> bool:
        return True  # it undoes a cordon
