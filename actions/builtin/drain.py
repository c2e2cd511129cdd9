"""The `drain` action's runtime: Kubernetes — cordon the node, then evict its GPU pods through the Eviction API
(policy/v1), which PodDisruptionBudgets govern: a 429 (the budget allows no disruption now) is asked again until
`timeout`, then `after_timeout: wait` leaves the rest running (reported) or `delete` deletes them; Slurm —
State=DRAIN.

Pods of DaemonSets, mirror (static) pods, finished pods and pods that hold no GPU are left; pods in protected
namespaces or with protected workload labels are left and said so. Each eviction posts an Event on its pod."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from lightkube import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from actions.builtin.cordon import DRAINED
from actions.builtin.cordon import _kubernetes as cordon_kubernetes
from actions.builtin.cordon import _slurm as cordon_slurm
from actions.builtin.kill import node_of
from actions.kube import kube_errors, post_event
from actions.protocol import ActionContext, ActionResult
from actions.specs.cordon import CordonParams
from actions.specs.drain import DrainParams, DrainSpec

#: how long to wait before asking again for an eviction a PodDisruptionBudget refused
RETRY_S = 2.0
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def _requested(pod: dict[str, Any]) -> set[str]:
    out: set[str] = set()
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        out |= set(res.get("limits") or {}) | set(res.get("requests") or {})
    return out


def gpu_resource(name: str, resources: list[str]) -> bool:
    return any(name == r or (r[-1:] in ("-", "/") and name.startswith(r)) or name.startswith(r + ".")
               for r in resources)


def why_left(pod: dict[str, Any], ctx: ActionContext, resources: list[str]) -> str | None:
    """Why drain leaves this pod alone (None: evict it)."""
    md = pod.get("metadata") or {}
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return "finished"
    if MIRROR_ANNOTATION in (md.get("annotations") or {}):
        return "a static pod"
    if any(r.get("kind") == "DaemonSet" for r in md.get("ownerReferences") or []):
        return "a DaemonSet's pod"
    if not any(gpu_resource(r, resources) for r in _requested(pod)):
        return "holds no GPU"
    if md.get("namespace") in ctx.config.protect.namespaces:
        return f"namespace {md.get('namespace')} is protected"
    labels = md.get("labels") or {}
    for k, v in ctx.config.protect.workload_labels.items():
        if labels.get(k) == v:
            return f"label {k}={v} is protected"
    return None


async def _evict(ctx: ActionContext, pod: dict[str, Any]) -> str | None:
    """Ask for one eviction: None when granted (or the pod is gone), 'budget' when a PDB refuses it now."""
    md = pod["metadata"]
    client = ctx.services.kube()
    try:
        await client.create(Pod.Eviction(metadata=ObjectMeta(name=md["name"], namespace=md["namespace"])),
                            name=md["name"], namespace=md["namespace"])
    except ApiError as e:
        code = e.status.code or e.response.status_code
        if code == 404:
            return None
        if code == 429:
            return "budget"
        with kube_errors(f"evict pod {md['namespace']}/{md['name']}"):
            raise
    await post_event(client, {**pod, "apiVersion": "v1", "kind": "Pod"}, "GpueventsEvicted",
                     f"evicted by gpuevents rule {ctx.request.rule}: node {pod['spec'].get('nodeName')} is drained",
                     warning=True, now=ctx.services.clock.now())
    return None


async def _kubernetes(ctx: ActionContext, p: DrainParams, node: str) -> ActionResult:
    cordoned = await cordon_kubernetes(ctx, node, True, False, via="drain")
    client = ctx.services.kube()
    resources = ctx.config.agent.pod_resources.resources
    with kube_errors(f"list pods on node {node}"):
        pods = [o.to_dict() async for o in client.list(Pod, namespace="*", fields={"spec.nodeName": node})]
    left: list[str] = []
    todo: list[dict[str, Any]] = []
    for pod in pods:
        why = why_left(pod, ctx, resources)
        name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        if why is None:
            todo.append(pod)
        elif why not in ("finished", "holds no GPU"):
            left.append(f"{name} ({why})")
    evicted: list[str] = []
    deadline = time.monotonic() + float(p.timeout)
    while todo:
        blocked = []
        for pod in todo:
            if await _evict(ctx, pod) == "budget":
                blocked.append(pod)
            else:
                evicted.append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
        todo = blocked
        if not todo or time.monotonic() >= deadline:
            break
        await asyncio.sleep(min(RETRY_S, max(0.0, deadline - time.monotonic())))
    blocked_names = [f"{x['metadata']['namespace']}/{x['metadata']['name']}" for x in todo]
    deleted: list[str] = []
    if todo and p.after_timeout == "delete":
        for pod in todo:
            md = pod["metadata"]
            with kube_errors(f"delete pod {md['namespace']}/{md['name']}"):
                try:
                    await client.delete(Pod, md["name"], namespace=md["namespace"])
                except ApiError as e:
                    if (e.status.code or e.response.status_code) != 404:
                        raise
            deleted.append(f"{md['namespace']}/{md['name']}")
    if evicted or deleted:  # what it changed, on the node (beside the cordon's annotations)
        record = {"rule": ctx.request.rule, "at": ctx.services.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "evicted": evicted, "deleted": deleted}
        with kube_errors(f"annotate node {node}"):
            await client.patch(Node, node, {"metadata": {"annotations": {DRAINED: json.dumps(record)}}},
                               patch_type=PatchType.MERGE)
    parts = [cordoned.detail or f"node {node} cordoned", f"{len(evicted)} GPU pod(s) evicted"]
    if deleted:
        parts.append(f"{len(deleted)} deleted after the {p.timeout:g}s timeout (PodDisruptionBudget): "
                     + ", ".join(deleted))
    elif blocked_names:
        parts.append(f"{len(blocked_names)} still running at the {p.timeout:g}s timeout, their "
                     f"PodDisruptionBudget allowing no eviction (after_timeout: wait): " + ", ".join(blocked_names))
    if left:
        parts.append("left: " + ", ".join(left))
    return ActionResult(detail="; ".join(parts), data={"node": node, "evicted": evicted, "deleted": deleted,
                                                       "blocked": [] if deleted else blocked_names, "left": left})


class DrainAction(DrainSpec):
    async def run(self, params: DrainParams, ctx: ActionContext) -> ActionResult:
        p = params
        node = p.node or node_of(ctx.request)
        if p.provider == "slurm":
            return await cordon_slurm(ctx, node, True, CordonParams(provider="slurm", node=node, reason=p.reason))
        return await _kubernetes(ctx, p, node)
