"""The `drain` action's parameters: cordon a node and evict its GPU pods (Kubernetes) or State=DRAIN (Slurm);
runtime actions.builtin.drain."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from actions.protocol import Action, ActionParams
from actions.registry import register
from gpuevents.durations import Duration
from gpuevents.records import ActionUnit, EntityKind


class DrainParams(ActionParams):
    type: Literal["drain"] = "drain"
    provider: Literal["kubernetes", "slurm"] = "kubernetes"
    node: str | None = Field(default=None, description="default: the entity's node")
    reason: str | None = None
    timeout: Duration = Field(default=600, description="how long evictions refused by a PodDisruptionBudget "
                              "are asked again")
    after_timeout: Literal["wait", "delete"] = Field(default="wait", description="what happens to the pods still "
                                                     "there at the timeout: left (reported) or deleted")


@register
class DrainSpec(Action[DrainParams]):
    type: ClassVar[str] = "drain"
    params = DrainParams
    entity_kinds: ClassVar[frozenset[EntityKind]] = frozenset({"node", "gpu"})
    destructive: ClassVar[bool] = True
    unit: ClassVar[ActionUnit] = "node"
    runtime: ClassVar[str | None] = "actions.builtin.drain:DrainAction"

    def run_timeout(self, params: DrainParams, default: float) -> float:
        return float(params.timeout) + default  # the evictions' own timeout, then the deletes
