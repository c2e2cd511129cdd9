"""The `log` action: writes `message` to the engine's log; the audit keeps it too (light: it runs itself)."""

from __future__ import annotations

import logging
from typing import ClassVar, Literal

from actions.protocol import Action, ActionContext, ActionParams, ActionResult
from actions.registry import register

log = logging.getLogger("gpuevents.actions.log")

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class LogParams(ActionParams):
    type: Literal["log"] = "log"
    message: str
    level: Literal["debug", "info", "warning", "error"] = "info"


@register
class LogAction(Action[LogParams]):
    type: ClassVar[str] = "log"
    params = LogParams

    async def run(self, params: LogParams, ctx: ActionContext) -> ActionResult:
        req = ctx.request
        log.log(_LEVELS[params.level], "[%s] %s: %s", req.rule, req.entity_id, params.message)
        return ActionResult(detail=params.message)
