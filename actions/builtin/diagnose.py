"""The `diagnose` action's runtime: one DiagnoseCommand to the node's agent, which starts its configured
diagnostic and answers at once; the result reaches the rules in the node's next snapshots."""

from __future__ import annotations

from actions.builtin.kill import ask_agent, node_of
from actions.protocol import ActionContext, ActionResult
from actions.specs.diagnose import DiagnoseParams, DiagnoseSpec
from gpuevents.diagnose import DIAGNOSE_VERB, DiagnoseCommand, DiagnoseReply
from gpuevents.subjects import command_subject

REPLY_TIMEOUT_S = 10.0  # the agent answers once the run started, not when it ends


class DiagnoseAction(DiagnoseSpec):
    def run_timeout(self, params: DiagnoseParams, default: float) -> float:
        return REPLY_TIMEOUT_S + default

    async def run(self, params: DiagnoseParams, ctx: ActionContext) -> ActionResult:
        req = ctx.request
        node = node_of(req)
        subject = command_subject(req.cluster, node, DIAGNOSE_VERB)
        cmd = DiagnoseCommand(rule=req.rule[:200], key=req.key[:400])
        reply = await ask_agent(ctx, subject, cmd, DiagnoseReply, REPLY_TIMEOUT_S, what="diagnose")
        detail = f"diagnostic on {node} {reply.outcome}" + (f" ({reply.reason})" if reply.reason else "")
        data = reply.model_dump(mode="json")
        if reply.outcome == "refused":
            return ActionResult(status="refused", detail=detail, data=data)
        return ActionResult(detail=detail, data=data)
