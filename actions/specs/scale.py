"""The `scale` action's parameters: a Deployment or StatefulSet, or a command; `replicas: previous` restores;
runtime actions.builtin.scale."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from actions.protocol import Action, ActionParams
from actions.registry import register
from gpuevents.durations import Duration

REPLICAS_PLACEHOLDER = "{replicas}"


class ScaleParams(ActionParams):
    type: Literal["scale"] = "scale"
    provider: Literal["kubernetes", "command"] = "kubernetes"
    kind: Literal["Deployment", "StatefulSet"] = "Deployment"
    namespace: str = "default"
    name: str | None = Field(default=None, description="the workload (kubernetes); a label for KV (command)")
    replicas: int | Literal["previous"] = Field(description="a count, or `previous`")
    argv: list[str] | None = Field(default=None, description=f"provider command; `{REPLICAS_PLACEHOLDER}` "
                                   "in an element becomes the count")
    current: int | None = Field(default=None, ge=0, description="provider command: the count before "
                                "scaling, recorded for `previous`")
    timeout: Duration | None = None

    @model_validator(mode="after")
    def _check(self) -> ScaleParams:
        if isinstance(self.replicas, int) and self.replicas < 0:
            raise ValueError("replicas must be 0 or more, or `previous`")
        if self.provider == "kubernetes" and not self.name:
            raise ValueError("provider 'kubernetes' needs `name` (and `namespace`, `kind`)")
        if self.provider == "command" and not self.argv:
            raise ValueError("provider 'command' needs `argv`, a list: program and arguments")
        return self


@register
class ScaleSpec(Action[ScaleParams]):
    type: ClassVar[str] = "scale"
    params = ScaleParams
    destructive: ClassVar[bool] = True
    runtime: ClassVar[str | None] = "actions.builtin.scale:ScaleAction"

    @classmethod
    def restores(cls, params: Mapping[str, Any]) -> bool:
        return params.get("replicas") == "previous"  # back to the count it had before this rule scaled it
