"""The `log` action: writes `message` to the engine's log; the audit keeps it too."""

from __future__ import annotations

import logging
from typing import ClassVar, Literal

from actions.escaping import no_escape
from actions.protocol import ALL_KINDS, ActionContext, ActionParams, ActionResult, ActionUnit
from actions.registry import register

log = logging.getLogger("gpuevents.actions.log")

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class LogParams(ActionParams):
    type: Literal["log"] = "log"
    message: str
    level: Literal["debug", "info", "warning", "error"] = "info"


@register
class LogAction:
    type: ClassVar[str] = "log"
    params = LogParams
    entity_kinds = ALL_KINDS
    destructive: ClassVar[bool] = False
    unit: ClassVar[ActionUnit] = "entity"
    escape = staticmethod(no_escape)

    async def run(self, ctx: ActionContext) -> ActionResult:
        p = ctx.params
        assert isinstance(p, LogParams)
        req = ctx.request
        log.log(_LEVELS[p.level], "[%s] %s: %s", req.rule, req.entity_id, p.message)
        return ActionResult(detail=p.message)
