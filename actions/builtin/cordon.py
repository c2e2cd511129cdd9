"""The `cordon` and `uncordon` actions' runtime: node (un)schedulable through Kubernetes, Slurm or a command.

On Kubernetes a cordon writes on the node what it changed: `gpuevents.io/cordoned-by` (the rule and when) and
`gpuevents.io/cordoned` (JSON: the rule, when, the action that did it, the previous `spec.unschedulable`), in
the same patch; drain adds `gpuevents.io/drained` (the pods it evicted or deleted, the rule, when). Uncordon works
from those alone (no engine store) and removes them."""

from __future__ import annotations

import json
from typing import Any

from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from actions.builtin.command import run_command
from actions.builtin.kill import node_of
from actions.escaping import UnsafeValue, single_node
from actions.kube import kube_errors
from actions.protocol import ActionContext, ActionResult
from actions.specs.cordon import CordonParams, CordonSpec, NodeParams, UncordonParams, UncordonSpec

ANNOTATION = "gpuevents.io/cordoned-by"
CORDONED = "gpuevents.io/cordoned"
DRAINED = "gpuevents.io/drained"  # written by drain: the pods it evicted or deleted, the rule, when


def _reason(ctx: ActionContext, p: NodeParams) -> str:
    return p.reason or f"gpuevents rule {ctx.request.rule}"


async def _kubernetes(ctx: ActionContext, node: str, cordon: bool, force: bool, via: str = "cordon") -> ActionResult:
    client = ctx.services.kube()
    with kube_errors(f"get node {node}"):
        current = await client.get(Node, node)
    annotations = dict(current.metadata.annotations or {}) if current.metadata else {}
    unschedulable = bool(current.spec.unschedulable) if current.spec else False
    ours = annotations.get(ANNOTATION)
    if cordon and unschedulable:
        return ActionResult(detail=f"node {node} was already cordoned" + (f" by {ours}" if ours else ""))
    if not cordon and not unschedulable:
        return ActionResult(detail=f"node {node} was already schedulable")
    if not cordon and ours is None and not force:
        return ActionResult(detail=f"node {node} left cordoned: not cordoned by gpuevents (force: true overrides)")
    now = ctx.services.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
    patch: dict[str, Any]
    if cordon:
        record = {"rule": ctx.request.rule, "at": now, "via": via,
                  "previous": {"spec.unschedulable": current.spec.unschedulable if current.spec else None}}
        patch = {"spec": {"unschedulable": True},
                 "metadata": {"annotations": {ANNOTATION: f"{ctx.request.rule} {now}", CORDONED: json.dumps(record)},
                              "resourceVersion": current.metadata.resourceVersion if current.metadata else None}}
    else:
        patch = {"spec": {"unschedulable": None},
                 "metadata": {"annotations": {ANNOTATION: None, CORDONED: None, DRAINED: None}}}
    with kube_errors(f"patch node {node}"):
        await client.patch(Node, node, patch, patch_type=PatchType.MERGE)
    return ActionResult(detail=f"node {node} {'cordoned' if cordon else 'uncordoned'}",
                        data={"node": node, "patch": patch})


async def _slurm(ctx: ActionContext, node: str, cordon: bool, p: NodeParams) -> ActionResult:
    try:
        single_node(node)
    except UnsafeValue as e:
        return ActionResult(status="refused", detail=str(e))
    scontrol = str(ctx.config.actions.slurm.scontrol)
    argv = [scontrol, "update", f"NodeName={node}"]
    argv += ["State=DRAIN", f"Reason={_reason(ctx, p)}"] if cordon else ["State=RESUME"]
    return await run_command(argv, ctx, timeout=p.timeout)


async def _run(ctx: ActionContext, p: NodeParams, cordon: bool) -> ActionResult:
    node = p.node or node_of(ctx.request)
    if p.provider == "kubernetes":
        return await _kubernetes(ctx, node, cordon, isinstance(p, UncordonParams) and p.force)
    if p.provider == "slurm":
        return await _slurm(ctx, node, cordon, p)
    assert p.argv is not None
    return await run_command(p.argv, ctx, timeout=p.timeout)


class CordonAction(CordonSpec):
    async def run(self, params: CordonParams, ctx: ActionContext) -> ActionResult:
        return await _run(ctx, params, cordon=True)


class UncordonAction(UncordonSpec):
    async def run(self, params: UncordonParams, ctx: ActionContext) -> ActionResult:
        return await _run(ctx, params, cordon=False)
