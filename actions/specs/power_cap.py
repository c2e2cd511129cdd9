"""The `power_cap` action's parameters: lower a held-idle GPU's power limit through the node's agent, or put
it back (`restore: true`, for `on_resolve`); runtime actions.builtin.power_cap."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field

from actions.protocol import Action, ActionParams
from actions.registry import register
from gpuevents.records import EntityKind


class PowerCapParams(ActionParams):
    type: Literal["power_cap"] = "power_cap"
    watts: float | None = Field(default=None, gt=0, description="the limit; default the GPU's minimum (a lower "
                                "value is raised to it)")
    restore: bool = Field(default=False, description="put back the limit a cap lowered (on_resolve)")


@register
class PowerCapSpec(Action[PowerCapParams]):
    """Gentle: nothing stops, the GPU only draws less while nobody uses it, and the agent puts the limit back on
    activity, when a holder ends, and when it stops; so not destructive (DESIGN §3.4's list)."""

    type: ClassVar[str] = "power_cap"
    params = PowerCapParams
    entity_kinds: ClassVar[frozenset[EntityKind]] = frozenset({"gpu"})
    runtime: ClassVar[str | None] = "actions.builtin.power_cap:PowerCapAction"

    @classmethod
    def restores(cls, params: Mapping[str, Any]) -> bool:
        return bool(params.get("restore"))
