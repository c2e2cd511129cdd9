"""The `scale` action's runtime: a Deployment or StatefulSet, or a command; `replicas: previous` restores the count
this rule scaled it from (kept in KV and, for Kubernetes, on the workload as the `gpuevents.io/scaled` annotation:
the count before, the rule, when; so `previous` works from the cluster alone when the engine's store is gone).

The count and the annotation change in one merge patch of the workload, conditional on its resourceVersion:
both or neither."""

from __future__ import annotations

from typing import Any

from lightkube.resources.apps_v1 import Deployment, StatefulSet
from lightkube.types import PatchType
from pydantic import BaseModel, ValidationError

from actions.builtin.command import run_command
from actions.kube import kube_errors
from actions.protocol import ActionContext, ActionResult, PermanentError
from actions.specs.scale import REPLICAS_PLACEHOLDER, ScaleParams, ScaleSpec
from actions.store import kv_key
from gpuevents.kvstate import parse_or_none

SCALED = "gpuevents.io/scaled"


class _Previous(BaseModel):
    replicas: int
    rule: str
    at: str


def _annotated(obj: Any, rule: str) -> _Previous | None:
    """The count before `rule` scaled this workload, as written on it."""
    raw = ((obj.metadata.annotations if obj.metadata else None) or {}).get(SCALED)
    try:
        got = _Previous.model_validate_json(raw) if raw else None
    except ValidationError:
        return None
    return got if got is not None and got.rule == rule else None


def _previous_key(rule: str, p: ScaleParams) -> str:
    return kv_key("actions", "scale", rule, p.provider, p.kind, p.namespace, p.name or " ".join(p.argv or []))


async def _target(ctx: ActionContext, p: ScaleParams, on_object: _Previous | None = None) -> int:
    if p.replicas != "previous":
        return p.replicas
    kv = ctx.services.kv
    got = await kv.get(_previous_key(ctx.request.rule, p))
    previous = None if got is None else parse_or_none(_Previous, got, "deleting it")
    if got is not None and previous is None:
        await kv.delete(got.key)
    previous = previous or on_object
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


async def _kubernetes(ctx: ActionContext, p: ScaleParams) -> ActionResult:
    res = Deployment if p.kind == "Deployment" else StatefulSet
    client = ctx.services.kube()
    what = f"{p.kind} {p.namespace}/{p.name}"
    assert p.name is not None
    with kube_errors(f"get {what}"):
        obj: Any = await client.get(res, p.name, namespace=p.namespace)
    rule = ctx.request.rule
    target = await _target(ctx, p, _annotated(obj, rule))
    before = obj.spec.replicas if obj.spec and obj.spec.replicas is not None else 1  # the API's default
    annotation: str | None
    if p.replicas == "previous":
        annotation = None  # restored: nothing to remember
    elif before != target and _annotated(obj, rule) is None:
        now = ctx.services.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
        annotation = _Previous(replicas=before, rule=rule, at=now).model_dump_json()
    else:
        annotation = ((obj.metadata.annotations if obj.metadata else None) or {}).get(SCALED)
    current = ((obj.metadata.annotations if obj.metadata else None) or {}).get(SCALED)
    if before == target and annotation == current:
        await _remember(ctx, p, before, target)
        return ActionResult(detail=f"{what} already at {target} replicas", data={"replicas": target})
    patch = {"spec": {"replicas": target}, "metadata": {"annotations": {SCALED: annotation},
                                                        "resourceVersion": obj.metadata.resourceVersion}}
    with kube_errors(f"scale {what}"):
        await client.patch(res, p.name, patch, namespace=p.namespace, patch_type=PatchType.MERGE)
    await _remember(ctx, p, before, target)
    return ActionResult(detail=f"{what} scaled from {before} to {target}",
                        data={"before": before, "replicas": target})


class ScaleAction(ScaleSpec):
    async def run(self, params: ScaleParams, ctx: ActionContext) -> ActionResult:
        p = params
        if p.provider == "kubernetes":
            return await _kubernetes(ctx, p)
        target = await _target(ctx, p)
        assert p.argv is not None
        argv = [a.replace(REPLICAS_PLACEHOLDER, str(target)) for a in p.argv]
        result = await run_command(argv, ctx, timeout=p.timeout)
        if result.status == "ok":
            await _remember(ctx, p, p.current, target)
        return result
