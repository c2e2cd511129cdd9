"""The `power_cap` action's runtime: one PowerCapCommand to the GPU's agent (DESIGN §5), checked there as a
kill is: the GPU and the processes holding it must still be the ones the rule decided on."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from actions.builtin.kill import ask_agent, node_of
from actions.protocol import ActionContext, ActionResult, PermanentError
from actions.specs.power_cap import PowerCapParams, PowerCapSpec
from gpuevents.commands import POWER_CAP_VERB, PowerCapCommand, PowerCapReply, kill_targets
from gpuevents.subjects import command_subject

REPLY_TIMEOUT_S = 20.0  # NVML calls and the round trip


class PowerCapAction(PowerCapSpec):
    def run_timeout(self, params: PowerCapParams, default: float) -> float:
        return REPLY_TIMEOUT_S + default

    async def run(self, params: PowerCapParams, ctx: ActionContext) -> ActionResult:
        req = ctx.request
        gpu = req.facts.gpu
        if gpu is None or gpu.index is None:
            raise PermanentError("cannot read the GPU and its processes from the request: it names no GPU index")
        try:
            procs = [] if params.restore else kill_targets(req.facts)
        except (ValueError, ValidationError) as e:
            raise PermanentError(f"cannot read the GPU and its processes from the request: {e}") from None
        cmd = PowerCapCommand(index=gpu.index, uuid=gpu.uuid or "", watts=params.watts, processes=procs,
                              restore=params.restore, rule=req.rule, key=req.key)
        subject = command_subject(req.cluster, node_of(req), POWER_CAP_VERB)
        reply = await ask_agent(ctx, subject, cmd, PowerCapReply, REPLY_TIMEOUT_S, what="power_cap",
                                about=f" about GPU {gpu.index}")
        data: dict[str, Any] = reply.model_dump(mode="json")
        detail = f"GPU {gpu.index} {reply.outcome}" + (f" at {reply.limit_w:g} W" if reply.limit_w else "") + (
            f" ({reply.reason})" if reply.reason else "")
        if reply.outcome == "refused":
            return ActionResult(status="refused", detail=detail, data=data)
        return ActionResult(detail=detail, data=data)
