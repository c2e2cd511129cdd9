"""The `scale` action's runtime: a Deployment or StatefulSet through the scale subresource, or a command;
`replicas: previous` restores the count this rule scaled it from (kept in KV)."""

from __future__ import annotations

from typing import Any

from lightkube.resources.apps_v1 import Deployment, StatefulSet
from lightkube.types import PatchType
from pydantic import BaseModel

from actions.builtin.command import run_command
from actions.kube import kube_errors
from actions.protocol import ActionContext, ActionResult, PermanentError
from actions.specs.scale import REPLICAS_PLACEHOLDER, ScaleParams, ScaleSpec
from actions.store import kv_key
from gpuevents.kvstate import parse_or_none


class _Previous(BaseModel):
    replicas: int
    rule: str
    at: str


def _previous_key(rule: str, p: ScaleParams) -> str:
    return kv_key("actions", "scale", rule, p.provider, p.kind, p.namespace, p.name or " ".join(p.argv or []))


async def _target(ctx: ActionContext, p: ScaleParams) -> int:
    if p.replicas != "previous":
        return p.replicas
    kv = ctx.services.kv
    got = await kv.get(_previous_key(ctx.request.rule, p))
    previous = None if got is None else parse_or_none(_Previous, got, "deleting it")
    if got is not None and previous is None:
        await kv.delete(got.key)
    if previous is None:
        raise PermanentError(f"replicas: previous, but rule {ctx.request.rule} has not scaled "
                             f"{p.kind} {p.namespace}/{p.name} before")
    return previous.replicas


async def _remember(ctx: ActionContext, p: ScaleParams, before: int | None, after: int) -> None:
    """Keep the count before a change; forget it once `previous` restored it."""
    svc = ctx.services
    key = _previous_key(ctx.request.rule, p)
    if p.replicas == "previous":
        await svc.kv.delete(key)
    elif before is not None and before != after and await svc.kv.get(key) is None:
        value = _Previous(replicas=before, rule=ctx.request.rule, at=svc.clock.now().isoformat())
        await svc.kv.put(key, value.model_dump_json().encode())


async def _kubernetes(ctx: ActionContext, p: ScaleParams, target: int) -> ActionResult:
    res = Deployment.Scale if p.kind == "Deployment" else StatefulSet.Scale
    client = ctx.services.kube()
    what = f"{p.kind} {p.namespace}/{p.name}"
    assert p.name is not None
    with kube_errors(f"get scale of {what}"):
        scale: Any = await client.get(res, p.name, namespace=p.namespace)
    before = scale.spec.replicas if scale.spec and scale.spec.replicas is not None else 0
    if before == target:
        await _remember(ctx, p, before, target)
        return ActionResult(detail=f"{what} already at {target} replicas", data={"replicas": target})
    with kube_errors(f"scale {what}"):
        await client.patch(res, p.name, {"spec": {"replicas": target}}, namespace=p.namespace,
                           patch_type=PatchType.MERGE)
    await _remember(ctx, p, before, target)
    return ActionResult(detail=f"{what} scaled from {before} to {target}",
                        data={"before": before, "replicas": target})


class ScaleAction(ScaleSpec):
    async def run(self, params: ScaleParams, ctx: ActionContext) -> ActionResult:
        p = params
        target = await _target(ctx, p)
        if p.provider == "kubernetes":
            return await _kubernetes(ctx, p, target)
        assert p.argv is not None
        argv = [a.replace(REPLICAS_PLACEHOLDER, str(target)) for a in p.argv]
        result = await run_command(argv, ctx, timeout=p.timeout)
        if result.status == "ok":
            await _remember(ctx, p, p.current, target)
        return result
