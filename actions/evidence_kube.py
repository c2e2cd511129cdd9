"""The Kubernetes half of actions/evidence.py: on every reporting node, pods bound there that hold GPUs and whose
owner chain reaches the target, with the uid decided on; what the API server shows of the target (uid, generation,
annotations, pods) replaces the node's claim in the request's job facts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod

from actions.claims import (
    MAX_OWNER_DEPTH,
    Contradicted,
    Refused,
    claimed_gpus,
    gpu_count,
    reporting_nodes,
    with_job,
)
from actions.errors import TransientError
from actions.kube import kube_errors
from actions.protocol import ActionContext
from actions.specs.scale import ScaleParams
from gpuevents.exemptions import parse
from gpuevents.kube import resource_for
from gpuevents.kubekinds import KINDS, kind_of, split_job_id
from gpuevents.records import ActionRequest


@dataclass
class _Found:
    """What the API server shows of the target on the reporting nodes."""

    uids: dict[str, str] = field(default_factory=dict)  # uid -> the apiVersion its owner references name
    pods: dict[str, list[str]] = field(default_factory=dict)  # node -> the target's pods bound there
    gpus: dict[str, int] = field(default_factory=dict)  # node -> GPUs those pods hold


async def read(client: AsyncClient, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The object as a dict, None when it does not exist; API errors as the runner's retry rules want them."""
    with kube_errors(f"get {kind} {namespace}/{name}"):
        try:
            obj = await client.get(resource_for(api_version, kind), name, namespace=namespace)
        except ApiError as e:
            if (e.status.code or e.response.status_code) == 404:
                return None
            raise
    out: dict[str, Any] = obj.to_dict()
    return out


def _owner(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), refs[0] if refs else None)


async def _reaches(client: AsyncClient, namespace: str, pod: Mapping[str, Any], kind: str, name: str,
                   cache: dict[tuple[str, str, str], dict[str, Any] | None]) -> Mapping[str, Any] | None:
    """The owner reference by which the pod's owner chain reaches `kind`/`name`, or None."""
    obj: Mapping[str, Any] | None = pod
    for _ in range(MAX_OWNER_DEPTH):
        assert obj is not None
        ref = _owner(obj)
        if ref is None:
            return None
        if ref.get("kind") == kind and ref.get("name") == name:
            return ref
        key = (str(ref.get("apiVersion")), str(ref.get("kind")), str(ref.get("name")))
        if key not in cache:
            cache[key] = await read(client, *key[:2], namespace, key[2])
        obj = cache[key]
        if obj is None:
            return None
    return None


async def _find(client: AsyncClient, namespace: str, kind: str, name: str, nodes: list[str]) -> _Found:
    found = _Found()
    cache: dict[tuple[str, str, str], dict[str, Any] | None] = {}
    for node in nodes:
        with kube_errors(f"list the pods of {namespace} on {node}"):
            pods = [p.to_dict() async for p in client.list(Pod, namespace=namespace, fields={"spec.nodeName": node})]
        for pod in pods:
            md = pod.get("metadata") or {}
            if md.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            ref = await _reaches(client, namespace, pod, kind, name, cache)
            if ref is None:
                continue
            found.uids[str(ref.get("uid"))] = str(ref.get("apiVersion"))
            found.pods.setdefault(node, []).append(str(md.get("name")))
            found.gpus[node] = found.gpus.get(node, 0) + gpu_count(pod)
    return found


def _exempt(annotations: Mapping[str, str], rule: str, what: str, now: datetime) -> None:
    """Refuse when the object's own exemption annotations cover the rule now (whatever a node said of them)."""
    found, _ = parse(annotations, now)
    for ex in found:
        if ex.covers(rule, now):
            raise Refused(f"{what} is exempt by its annotation ({ex.source})")


def _part(req: ActionRequest, name: str) -> dict[str, Any]:
    got = req.facts.get(name)
    return got if isinstance(got, dict) else {}


async def confirm(ctx: ActionContext, how: str) -> ActionRequest:
    """See actions/evidence.confirm; `how` is `pause`, `scale` or `pod`."""
    req, p = ctx.request, ctx.params
    client = ctx.services.kube()
    if how == "pod":
        return await _confirm_pod(ctx, client)
    job = _part(req, "job")
    if how == "pause":
        from actions.builtin.pause import job_of

        job_id, _ = job_of(getattr(p, "job", None), req.facts)
        parts = split_job_id(job_id) if job_id else None
        if parts is None or parts[1] == "Pod":
            return req  # pause refuses it itself, acting on nothing
        namespace, kind, name = parts
        want_uid = job.get("controller_uid") if job.get("id") == job_id else None
    else:  # scale, of a Deployment or StatefulSet
        assert isinstance(p, ScaleParams) and p.name is not None and isinstance(p.replicas, int)
        namespace, kind, name = p.namespace, p.kind, p.name
        job_id = f"{namespace}/{kind}/{name}"
        if job_id not in {job.get("id"), _part(req, "gpu").get("job"), _part(req, "process").get("job")}:
            return req  # the rule names its target (a weekend scale-down): no node's claim to confirm
        want_uid = job.get("controller_uid") if job.get("id") == job_id else None
        obj = await read(client, KINDS[kind].api_version, kind, namespace, name)
        if obj is None or p.replicas >= int((obj.get("spec") or {}).get("replicas") or 0):
            return req  # gone (scale says so) or not scaled down: not a remedy on the workload
    nodes = reporting_nodes(req)
    if not nodes:  # a person's request names its target: resolve its uid, nothing to confirm on a node
        known = KINDS.get(kind)
        obj = await read(client, known.api_version, kind, namespace, name) if known and not want_uid else None
        if obj is None:
            return req
        md = obj.get("metadata") or {}
        return with_job(req, id=job_id, scheduler="kubernetes", namespace=namespace, controller_uid=md.get("uid"),
                         controller_generation=md.get("generation")) if how == "pause" else req
    found = await _find(client, namespace, kind, name, nodes)
    what = f"{kind} {namespace}/{name}"
    if not found.uids:
        raise Contradicted(f"no pod bound to {', '.join(nodes)} belongs to {what}", tuple(nodes))
    if len(found.uids) > 1:
        raise TransientError(f"pods of two objects named {what} ({', '.join(sorted(found.uids))}): one is being "
                             "replaced")
    (uid, api_version), = found.uids.items()
    if want_uid and want_uid != uid:
        raise Contradicted(f"{what} has uid {uid} on the API server, the claim names {want_uid}", tuple(nodes))
    short = [n for n in nodes if found.gpus.get(n, 0) < claimed_gpus(req, n)]
    if short:
        said = "; ".join(f"{n}: {found.gpus.get(n, 0)} GPU(s) held by its pods, {claimed_gpus(req, n)} claimed"
                         for n in short)
        raise Contradicted(f"{what} does not hold the GPUs claimed ({said})", tuple(short))
    target = await read(client, kind_of(api_version, kind).api_version, kind, namespace, name)
    if target is None:
        return req  # deleted since: the action finds it gone and says so
    md = target.get("metadata") or {}
    _exempt(md.get("annotations") or {}, req.rule, what, ctx.services.clock.now())
    gen, seen = md.get("generation"), (target.get("status") or {}).get("observedGeneration")
    if isinstance(gen, int) and isinstance(seen, int) and seen < gen:
        raise TransientError(f"{what}: generation {gen} still rolling out (observed {seen})")
    if how != "pause":
        return req
    return with_job(req, id=job_id, scheduler="kubernetes", namespace=namespace, controller_uid=uid,
                     controller_generation=gen, annotations=dict(md.get("annotations") or {}), nodes=nodes,
                     pods=sorted({pod for ps in found.pods.values() for pod in ps}))


async def _confirm_pod(ctx: ActionContext, client: AsyncClient) -> ActionRequest:
    """`cancel` of a pod: bound to a reporting node, holding a GPU, the uid the claim names."""
    req = ctx.request
    nodes = reporting_nodes(req)
    process = _part(req, "process")
    target = getattr(ctx.params, "job", None) or process.get("pod") or _part(req, "job").get("id")
    if not nodes or not target:
        return req
    parts = split_job_id(str(target))
    if parts is not None and parts[1] != "Pod":
        return req  # cancel refuses a controller's job itself
    namespace, _, name = (parts[0], "", parts[2]) if parts else str(target).partition("/")
    if not namespace or not name:
        return req
    pod = await read(client, "v1", "Pod", namespace, name)
    if pod is None:
        return req
    where = (pod.get("spec") or {}).get("nodeName")
    if where not in nodes:
        raise Contradicted(f"pod {namespace}/{name} is bound to {where or 'no node'}, not {', '.join(nodes)}",
                           tuple(nodes))
    if gpu_count(pod) < 1:
        raise Contradicted(f"pod {namespace}/{name} holds no GPU", (where,))
    want = process.get("pod_uid")
    uid = (pod.get("metadata") or {}).get("uid")
    if want and want != uid:
        raise Contradicted(f"pod {namespace}/{name} has uid {uid}, the claim names {want}", (where,))
    return req
