"""A pod's job: its top owner, walked through controller ownerReferences (Deployment via ReplicaSet, Job via
CronJob, JobSet, RayCluster, Kubeflow jobs, ...), with its user, labels and annotations; objects read through the
API (read-only) and cached per pod and per owner uid, never per sample."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuevents.config.kube import KubernetesJobsConfig
from gpuevents.kubekinds import job_id

log = logging.getLogger(__name__)

#: an owner chain longer than this is cut (a loop, or a very unusual operator)
MAX_DEPTH = 8
#: annotations of a pod's namespace that reach its job (the exemptions): others stay on the namespace
NAMESPACE_ANNOTATION_PREFIX = "gpuevents.io/"


@dataclass(frozen=True, slots=True)
class OwnerRef:
    api_version: str
    kind: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Meta:
    """What the walk keeps of one object."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str
    generation: int | None = None
    owner: OwnerRef | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    created: datetime | None = None
    started: datetime | None = None  # a pod's status.startTime


class Unreadable(Exception):
    """The API would not give an object (403, 5xx, the network): the walk stops at the last one it has."""


#: reads one object: (apiVersion, kind, namespace, name) -> its Meta, None when it does not exist
Fetch = Callable[[str, str, str, str], Awaitable[Meta | None]]


def _time(v: Any) -> datetime | None:
    if isinstance(v, datetime):
        return v
    if isinstance(v, str) and v:
        return datetime.fromisoformat(v.replace("Z", "+00:00"))
    return None


def meta_of(obj: Mapping[str, Any], api_version: str, kind: str) -> Meta:
    """A Kubernetes object as a dict (`to_dict()` of lightkube) -> Meta; the controller reference is its owner."""
    md = obj.get("metadata") or {}
    refs = md.get("ownerReferences") or []
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    status = obj.get("status") or {}
    return Meta(
        api_version=obj.get("apiVersion") or api_version, kind=obj.get("kind") or kind,
        namespace=md.get("namespace") or "", name=md.get("name") or "", uid=md.get("uid") or "",
        generation=md.get("generation"),
        owner=OwnerRef(ref["apiVersion"], ref["kind"], ref["name"], ref.get("uid", "")) if ref else None,
        labels=dict(md.get("labels") or {}), annotations=dict(md.get("annotations") or {}),
        created=_time(md.get("creationTimestamp")),
        started=_time(status.get("startTime")) if isinstance(status, Mapping) else None,
    )


@dataclass(frozen=True, slots=True)
class PodJob:
    """The job a pod belongs to, as the agent publishes it."""

    namespace: str
    pod: str
    pod_uid: str
    id: str  # <namespace>/<Kind>/<name> of the top owner; <namespace>/Pod/<name> for a bare pod
    controller: str | None  # Kind/name of the top owner; None for a bare pod
    controller_uid: str | None
    controller_generation: int | None
    chain: tuple[str, ...]  # Kind/name from the pod's first owner up to the top one
    user: str | None
    labels: dict[str, str]
    annotations: dict[str, str]
    started_at: datetime | None
    stopped_short: str | None = None  # why the walk could not reach the top (then the top known is used)


def first_value(key: str | None, *sources: Mapping[str, str]) -> str | None:
    if not key:
        return None
    return next((s[key] for s in sources if s.get(key)), None)


def pod_job(pod: Meta, chain: list[Meta], namespace: Meta | None, cfg: KubernetesJobsConfig,
            stopped_short: str | None = None) -> PodJob:
    """The job of `pod` given its owners (nearest first) and its namespace."""
    top = chain[-1] if chain else None
    ns_ann = {k: v for k, v in (namespace.annotations if namespace else {}).items()
              if k.startswith(NAMESPACE_ANNOTATION_PREFIX)}
    levels = [pod, *([top] if top else []), *([namespace] if namespace else [])]
    user = first_value(cfg.user_annotation, *(m.annotations for m in levels)) or first_value(
        cfg.user_label, *(m.labels for m in levels))
    # most specific wins: the pod's annotations over its top owner's over its namespace's gpuevents.io/ ones
    annotations = {**ns_ann, **(top.annotations if top else {}), **pod.annotations}
    return PodJob(
        namespace=pod.namespace, pod=pod.name, pod_uid=pod.uid,
        id=job_id(pod.namespace, top.kind, top.name) if top else job_id(pod.namespace, "Pod", pod.name),
        controller=f"{top.kind}/{top.name}" if top else None, controller_uid=top.uid if top else None,
        controller_generation=top.generation if top else None,
        chain=tuple(f"{m.kind}/{m.name}" for m in chain), user=user,
        labels=dict(top.labels if top else pod.labels), annotations=annotations,
        started_at=pod.started or pod.created, stopped_short=stopped_short,
    )


class OwnerWalker:
    """Resolves pods to their jobs; owners cached by uid, pods by namespace/name and uid, for `owner_cache`."""

    def __init__(self, fetch: Fetch | None, cfg: KubernetesJobsConfig, *,
                 monotonic: Callable[[], float] = time.monotonic,
                 close: Callable[[], Awaitable[None]] | None = None) -> None:
        """`fetch` None: no API to ask (the walk is off): every pod is its own job. `close` ends its client."""
        self.fetch = fetch
        self._close = close
        self.cfg = cfg
        self._now = monotonic
        self._owners: dict[str, tuple[float, Meta]] = {}
        self._namespaces: dict[str, tuple[float, Meta | None]] = {}
        self.jobs: dict[str, tuple[float, PodJob]] = {}  # namespace/pod -> its job
        self.reads = 0
        self.errors = 0
        self._said: set[str] = set()

    def _fresh(self, at: float) -> bool:
        return self._now() - at < self.cfg.owner_cache

    async def _read(self, api_version: str, kind: str, namespace: str, name: str) -> Meta | None:
        if self.fetch is None:
            return Meta(api_version, kind, namespace, name, "") if kind == "Pod" else None
        self.reads += 1
        return await self.fetch(api_version, kind, namespace, name)

    async def _owner(self, ref: OwnerRef, namespace: str) -> Meta | None:
        hit = self._owners.get(ref.uid) if ref.uid else None
        if hit is not None and self._fresh(hit[0]):
            return hit[1]
        got = await self._read(ref.api_version, ref.kind, namespace, ref.name)
        if got is not None and ref.uid and got.uid != ref.uid:
            return None  # a new object of the same name: the pod's owner is gone
        if got is not None and got.uid:
            self._owners[got.uid] = (self._now(), got)
        return got

    async def _namespace(self, name: str) -> Meta | None:
        hit = self._namespaces.get(name)
        if hit is not None and self._fresh(hit[0]):
            return hit[1]
        try:
            got = await self._read("v1", "Namespace", "", name)
        except Unreadable as e:
            self._say(f"namespace:{e}", f"cannot read namespace {name} ({e}): its annotations are not applied")
            got = None
        self._namespaces[name] = (self._now(), got)
        return got

    async def resolve(self, namespace: str, name: str) -> PodJob | None:
        """The pod's job (cached); None when the pod does not exist (any more)."""
        key = f"{namespace}/{name}"
        hit = self.jobs.get(key)
        if hit is not None and self._fresh(hit[0]):
            return hit[1]
        try:
            pod = await self._read("v1", "Pod", namespace, name)
        except Unreadable as e:
            self.errors += 1
            self._say(f"pod:{e}", f"cannot read pod {key} ({e}): its GPUs are reported as a bare pod's")
            pod = Meta("v1", "Pod", namespace, name, "")
        if pod is None:
            self.jobs.pop(key, None)
            return None
        chain: list[Meta] = []
        short: str | None = None
        ref = pod.owner
        while ref is not None and len(chain) < MAX_DEPTH:
            try:
                owner = await self._owner(ref, namespace)
            except Unreadable as e:
                self.errors += 1
                short = f"cannot read {ref.kind} {namespace}/{ref.name}: {e}"
                self._say(f"owner:{ref.kind}:{e}", f"{short}; jobs stop at the owner below it")
                break
            if owner is None:
                short = f"{ref.kind} {namespace}/{ref.name} does not exist (any more)"
                break
            chain.append(owner)
            ref = owner.owner
        job = pod_job(pod, chain, await self._namespace(namespace), self.cfg, short)
        self.jobs[key] = (self._now(), job)
        return job

    async def resolve_all(self, keys: Iterable[str]) -> dict[str, PodJob]:
        """The jobs of these pods (`namespace/name`); forgets the pods not among them."""
        wanted = set(keys)
        for k in [k for k in self.jobs if k not in wanted]:
            del self.jobs[k]
        out: dict[str, PodJob] = {}
        for k in sorted(wanted):
            namespace, _, name = k.partition("/")
            job = await self.resolve(namespace, name)
            if job is not None:
                out[k] = job
        return out

    async def close(self) -> None:
        if self._close is not None:
            await self._close()

    def _say(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning("%s", message)
