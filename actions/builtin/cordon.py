"""The `cordon` and `uncordon` actions: node (un)schedulable through Kubernetes, Slurm or a command."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType
from pydantic import Field, model_validator

from actions.builtin.command import run_command
from actions.builtin.kill import node_of
from actions.escaping import UnsafeValue, no_escape, single_node
from actions.kube import kube_errors
from actions.protocol import ActionContext, ActionParams, ActionResult, ActionUnit
from actions.registry import register
from actions.services import services_of
from gpuevents.durations import Duration

ANNOTATION = "gpuevents.io/cordoned-by"


class _NodeParams(ActionParams):
    provider: Literal["kubernetes", "slurm", "command"] = "kubernetes"
    node: str | None = Field(default=None, description="default: the entity's node")
    reason: str | None = None
    argv: list[str] | None = Field(default=None, description="provider command: the argv to run")
    timeout: Duration | None = None

    @model_validator(mode="after")
    def _argv_for_command(self) -> _NodeParams:
        if self.provider == "command" and not self.argv:
            raise ValueError("provider 'command' needs `argv`, a list: program and arguments")
        if self.provider != "command" and self.argv:
            raise ValueError(f"`argv` is for provider 'command', not {self.provider!r}")
        return self


class CordonParams(_NodeParams):
    type: Literal["cordon"] = "cordon"


class UncordonParams(_NodeParams):
    type: Literal["uncordon"] = "uncordon"
    force: bool = Field(default=False, description="also uncordon a node that gpuevents did not cordon")


def _reason(ctx: ActionContext, p: _NodeParams) -> str:
    return p.reason or f"gpuevents rule {ctx.request.rule}"


async def _kubernetes(ctx: ActionContext, node: str, cordon: bool, force: bool) -> ActionResult:
    client = services_of(ctx).kube()
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
    now = services_of(ctx).clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
    patch: dict[str, Any]
    if cordon:
        patch = {"spec": {"unschedulable": True},
                 "metadata": {"annotations": {ANNOTATION: f"{ctx.request.rule} {now}"}}}
    else:
        patch = {"spec": {"unschedulable": None}, "metadata": {"annotations": {ANNOTATION: None}}}
    with kube_errors(f"patch node {node}"):
        await client.patch(Node, node, patch, patch_type=PatchType.MERGE)
    return ActionResult(detail=f"node {node} {'cordoned' if cordon else 'uncordoned'}",
                        data={"node": node, "patch": patch})


async def _slurm(ctx: ActionContext, node: str, cordon: bool, p: _NodeParams) -> ActionResult:
    try:
        single_node(node)
    except UnsafeValue as e:
        return ActionResult(status="refused", detail=str(e))
    scontrol = str(ctx.config.actions.slurm.scontrol)
    argv = [scontrol, "update", f"NodeName={node}"]
    argv += ["State=DRAIN", f"Reason={_reason(ctx, p)}"] if cordon else ["State=RESUME"]
    return await run_command(argv, ctx, timeout=p.timeout)


async def _run(ctx: ActionContext, cordon: bool) -> ActionResult:
    p = ctx.params
    assert isinstance(p, _NodeParams)
    node = p.node or node_of(ctx.request)
    if p.provider == "kubernetes":
        return await _kubernetes(ctx, node, cordon, isinstance(p, UncordonParams) and p.force)
    if p.provider == "slurm":
        return await _slurm(ctx, node, cordon, p)
    assert p.argv is not None
    return await run_command(p.argv, ctx, timeout=p.timeout)


def _escape_at(path: tuple[str | int, ...]) -> Callable[[str], str]:
    return single_node if path == ("node",) else no_escape  # `argv`: registry.escape_for checks it


@register
class CordonAction:
    type: ClassVar[str] = "cordon"
    params = CordonParams
    entity_kinds = frozenset({"node", "gpu"})
    destructive: ClassVar[bool] = True
    unit: ClassVar[ActionUnit] = "node"  # its fleet share counts nodes
    escape = staticmethod(no_escape)
    escape_at = staticmethod(_escape_at)

    async def run(self, ctx: ActionContext) -> ActionResult:
        return await _run(ctx, cordon=True)


@register
class UncordonAction:
    type: ClassVar[str] = "uncordon"
    params = UncordonParams
    entity_kinds = frozenset({"node", "gpu"})
    destructive: ClassVar[bool] = False
    unit: ClassVar[ActionUnit] = "node"  # its fleet share counts nodes
    escape = staticmethod(no_escape)
    escape_at = staticmethod(_escape_at)

    @staticmethod
    def restores(params: Mapping[str, Any]) -> bool:
        return True  # it undoes a cordon

    async def run(self, ctx: ActionContext) -> ActionResult:
        return await _run(ctx, cordon=False)
