"""The `kill` action's runtime: asks the node's agent to signal a process, or every process on a GPU (DESIGN §5)."""

from __future__ import annotations

import asyncio
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from actions.protocol import ActionContext, ActionResult, PermanentError, TransientError
from actions.specs.kill import KillParams, KillSpec
from gpuevents.bus import BusNoResponders, BusTimeout
from gpuevents.commands import KILL_VERB, KILL_WAIT_S, KillCommand, KillReply, KillTarget, kill_targets
from gpuevents.records import ActionRequest
from gpuevents.subjects import command_subject

R = TypeVar("R", bound=BaseModel)
REPLY_MARGIN_S = 10.0  # on top of the agent's longest answer: its checks and the round trip


def reply_timeout(p: KillParams) -> float:
    """How long the agent may take to answer one command: the grace, the wait after SIGKILL, a margin.
    The agent answers the commands of one action concurrently, so this bounds the whole action too."""
    return p.grace + KILL_WAIT_S + REPLY_MARGIN_S


def node_of(request: ActionRequest) -> str:
    """The node the entity lives on: `request.node`, else the id's first part (`n1/gpu0` -> `n1`)."""
    if request.node:
        return request.node
    entity = request.entity_id.split(":", 1)[-1] if ":" in request.entity_id else request.entity_id
    return entity.split("/", 1)[0]


async def ask_agent(ctx: ActionContext, subject: str, cmd: BaseModel, reply: type[R], timeout: float, *,
                    what: str, about: str = "") -> R:
    """One command to a node's agent and its reply: no agent, or no answer in `timeout`, is transient (the agent
    may be restarting); an answer that is not a `what` reply is permanent."""
    try:
        raw = await ctx.services.bus.request(subject, cmd.model_dump_json().encode(), timeout)
    except BusNoResponders:
        raise TransientError(f"no agent answers on {subject}") from None
    except BusTimeout:
        raise TransientError(f"the agent on {subject} did not answer{about}") from None
    try:
        return reply.model_validate_json(raw)
    except ValidationError:
        raise PermanentError(f"the agent answered something that is not a {what} reply: {raw[:200]!r}") from None


def _summary(replies: list[KillReply]) -> str:
    parts = []
    for r in replies:
        why = f" ({r.reason})" if r.reason else ""
        parts.append(f"pid {r.pid} {r.outcome}{why}")
    return "; ".join(parts)


class KillAction(KillSpec):
    def run_timeout(self, params: KillParams, default: float) -> float:
        return reply_timeout(params) + default

    async def run(self, params: KillParams, ctx: ActionContext) -> ActionResult:
        p = params
        req = ctx.request
        try:
            targets = kill_targets(req.facts)
        except (ValueError, ValidationError) as e:
            raise PermanentError(f"cannot read the processes to kill from the request: {e}") from None
        if not targets:
            return ActionResult(status="failed", detail=f"no process to kill on {req.entity_id}")
        subject = command_subject(req.cluster, node_of(req), KILL_VERB)
        replies = await asyncio.gather(*(self._kill_one(ctx, subject, t, p) for t in targets))
        data = {"replies": [r.model_dump(mode="json") for r in replies]}
        if all(r.outcome == "refused" for r in replies):
            return ActionResult(status="refused", detail=_summary(replies), data=data)
        return ActionResult(detail=_summary(replies), data=data)

    async def _kill_one(self, ctx: ActionContext, subject: str, target: KillTarget,
                        p: KillParams) -> KillReply:
        cmd = KillCommand(pid=target.pid, create_time=target.create_time, signal=p.signal,
                          grace_s=p.grace, reason=p.reason or f"rule {ctx.request.rule}",
                          rule=ctx.request.rule, key=ctx.request.key)
        return await ask_agent(ctx, subject, cmd, KillReply, reply_timeout(p), what="kill",
                               about=f" about pid {target.pid}")
