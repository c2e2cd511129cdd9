"""The `diagnose` action's parameters: ask the node's agent to run the site's diagnostic (`agent.diagnostics`,
configured on the node, never sent); runtime actions.builtin.diagnose. The result comes back in the node's
snapshots as `node.diag_status`, `node.diag_passed_at`, `node.diag_failed_at`."""

from __future__ import annotations

from typing import ClassVar, Literal

from actions.protocol import Action, ActionParams
from actions.registry import register
from gpuevents.records import ActionUnit, EntityKind


class DiagnoseParams(ActionParams):
    type: Literal["diagnose"] = "diagnose"


@register
class DiagnoseSpec(Action[DiagnoseParams]):
    """Destructive: a diagnostic such as `dcgmi diag -r 2` loads every GPU of the node, so whatever still runs
    there is disturbed; it is warned of, limited and held by a breaker as a cordon is."""

    type: ClassVar[str] = "diagnose"
    params = DiagnoseParams
    entity_kinds: ClassVar[frozenset[EntityKind]] = frozenset({"node", "gpu"})
    unit: ClassVar[ActionUnit] = "node"
    destructive: ClassVar[bool] = True
    runtime: ClassVar[str | None] = "actions.builtin.diagnose:DiagnoseAction"
