"""Which pod holds which GPU, from the kubelet's PodResources answers: device ids as the NVIDIA device plugin
reports them (GPU UUIDs, MIG device UUIDs, time-sliced replicas, or indexes) matched to this node's GPUs. Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

#: the device plugin's resources that are GPUs: `nvidia.com/gpu`, `nvidia.com/gpu.shared` (time-slicing with
#: renamed resources), `nvidia.com/mig-1g.10gb` (MIG, mixed strategy)
DEFAULT_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/mig-")

_REPLICA = re.compile(r"^(?P<id>.+?)::\d+$")  # time-slicing: `GPU-<uuid>::<replica>`
_OLD_MIG = re.compile(r"^MIG-(?P<parent>GPU-[0-9a-fA-F-]+)/(?P<gi>\d+)/(?P<ci>\d+)$")  # drivers before R470


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """One pod as the kubelet lists it, with the GPU devices its containers were given (none for most pods)."""

    namespace: str
    name: str
    devices: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class GpuLike(Protocol):
    """What matching needs of a GPU reading."""

    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> str: ...
    @property
    def mig_parent(self) -> str | None: ...
    @property
    def mig_gi_id(self) -> int | None: ...


class _Devices(Protocol):
    @property
    def resource_name(self) -> str: ...
    @property
    def device_ids(self) -> Sequence[str]: ...


class _Container(Protocol):
    @property
    def devices(self) -> Sequence[_Devices]: ...


class _Pod(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def containers(self) -> Sequence[_Container]: ...


def is_gpu_resource(resource: str, resources: Sequence[str]) -> bool:
    """`resource` is one of `resources` (an entry ending in `-` or `/` is a prefix; `nvidia.com/gpu` also
    covers its renamed time-sliced form `nvidia.com/gpu.shared`)."""
    for r in resources:
        if resource == r or (r[-1:] in ("-", "/") and resource.startswith(r)) or resource.startswith(r + "."):
            return True
    return False


def pod_allocation(pod: _Pod, resources: Sequence[str]) -> PodAllocation:
    """A pod of a List or Get answer, with the ids of its GPU devices (every container's, in order, once each)."""
    seen: dict[str, None] = {}
    for c in pod.containers:
        for d in c.devices:
            if is_gpu_resource(d.resource_name, resources):
                for i in d.device_ids:
                    seen.setdefault(i, None)
    return PodAllocation(namespace=pod.namespace, name=pod.name, devices=tuple(seen))


def parse_list(pods: Iterable[_Pod], resources: Sequence[str]) -> dict[str, PodAllocation]:
    """Every pod the kubelet listed, by `namespace/name`, those without GPUs too (they hold none)."""
    out: dict[str, PodAllocation] = {}
    for p in pods:
        a = pod_allocation(p, resources)
        out[a.key] = a
    return out


def allocatable_devices(devices: Iterable[_Devices], resources: Sequence[str]) -> tuple[str, ...]:
    """The GPU device ids the node advertises (GetAllocatableResources)."""
    return tuple(i for d in devices if is_gpu_resource(d.resource_name, resources) for i in d.device_ids)


def gpu_of_device(device_id: str, gpus: Iterable[GpuLike]) -> int | None:
    """The index of the GPU (or MIG instance) that a device id names, or None when none of `gpus` is it.

    `GPU-<uuid>` and `MIG-<uuid>` are NVML's own UUIDs; `<id>::<n>` is replica n of a time-sliced GPU;
    `MIG-GPU-<uuid>/<gi>/<ci>` is a MIG device as drivers before R470 named it; a bare number is the GPU's
    index (the device plugin's `deviceIDStrategy: index`)."""
    m = _REPLICA.match(device_id)
    if m:
        device_id = m.group("id")
    old = _OLD_MIG.match(device_id)
    for g in gpus:
        if g.uuid and g.uuid == device_id:
            return g.index
        if old and g.mig_parent == old.group("parent") and g.mig_gi_id == int(old.group("gi")):
            return g.index
        if device_id.isdigit() and g.mig_parent is None and g.index == int(device_id):
            return g.index
    return None


def pods_by_gpu(pods: Mapping[str, PodAllocation], gpus: Sequence[GpuLike]) -> dict[int, list[str]]:
    """GPU index -> the pods (`namespace/name`, sorted) it is allocated to; several for a time-sliced GPU."""
    out: dict[int, list[str]] = {}
    for key in sorted(pods):
        for device in pods[key].devices:
            index = gpu_of_device(device, gpus)
            if index is not None and key not in out.get(index, []):
                out.setdefault(index, []).append(key)
    return out


def unmatched_devices(pods: Mapping[str, PodAllocation], gpus: Sequence[GpuLike]) -> list[str]:
    """Allocated device ids that name none of this node's GPUs (a device plugin naming them otherwise)."""
    return sorted({d for p in pods.values() for d in p.devices if gpu_of_device(d, gpus) is None})
