"""Which pod holds which GPU, from PodResources answers, pure: GPU resources (prefixes, the renamed time-sliced
form) told from others, each container's devices once, every listed pod kept, devices matched to this node's
GPUs by UUID, replica, old MIG name or index."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from agent.podalloc import (
    PodAllocation,
    allocatable_devices,
    gpu_of_device,
    is_gpu_resource,
    parse_list,
    pod_allocation,
    pods_by_gpu,
    unmatched_devices,
)

RESOURCES = ["nvidia.com/gpu", "nvidia.com/mig-"]
U0, U1 = "GPU-11111111-0000-0000-0000-000000000000", "GPU-22222222-0000-0000-0000-000000000000"
M1 = "MIG-33333333-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    mig_parent: str | None = None
    mig_gi_id: int | None = None


GPUS = [Gpu(0, U0), Gpu(1, U1), Gpu(2, M1, mig_parent=U1, mig_gi_id=3)]


@dataclass
class Devices:
    resource_name: str
    device_ids: list[str]


@dataclass
class Container:
    devices: list[Devices] = field(default_factory=list)


@dataclass
class Pod:
    name: str
    namespace: str
    containers: list[Container] = field(default_factory=list)


@pytest.mark.parametrize(("resource", "gpu"), [
    ("nvidia.com/gpu", True), ("nvidia.com/gpu.shared", True), ("nvidia.com/mig-1g.10gb", True),
    ("nvidia.com/gpus", False), ("example.com/nic", False), ("nvidia.com/mig", False),
])
def test_gpu_resources_are_told_from_others(resource: str, gpu: bool) -> None:
    assert is_gpu_resource(resource, RESOURCES) is gpu


def test_a_pods_devices_are_its_gpu_ones_from_every_container_once_in_order() -> None:
    pod = Pod("train", "ml", [Container([Devices("nvidia.com/gpu", [U1, U0]), Devices("example.com/nic", ["eth1"])]),
                              Container([Devices("nvidia.com/gpu", [U0])])])
    assert pod_allocation(pod, RESOURCES) == PodAllocation("ml", "train", (U1, U0))


def test_every_listed_pod_is_kept_by_its_key_those_without_gpus_too() -> None:
    pods = parse_list([Pod("coredns", "kube-system"), Pod("a", "ml", [Container([Devices("nvidia.com/gpu", [U0])])])],
                      RESOURCES)
    assert pods == {"kube-system/coredns": PodAllocation("kube-system", "coredns"),
                    "ml/a": PodAllocation("ml", "a", (U0,))}


def test_allocatable_devices_are_the_gpu_ones() -> None:
    devices = [Devices("nvidia.com/gpu", [U0, U1]), Devices("example.com/nic", ["eth1"]),
               Devices("nvidia.com/mig-1g.10gb", [M1])]
    assert allocatable_devices(devices, RESOURCES) == (U0, U1, M1)


@pytest.mark.parametrize(("device", "index"), [
    (U0, 0), (f"{U1}::4", 1), (M1, 2), (f"MIG-{U1}/3/0", 2), (f"MIG-{U1}/4/0", None), ("1", 1), ("2", None),
    ("GPU-99999999-0000-0000-0000-000000000000", None),
])
def test_a_device_id_names_a_gpu_by_uuid_replica_old_mig_name_or_index(device: str, index: int | None) -> None:
    assert gpu_of_device(device, GPUS) == index


def test_pods_by_gpu_lists_each_pod_once_sorted_and_the_unmatched_devices() -> None:
    pods = {"ml/b": PodAllocation("ml", "b", (f"{U0}::1", f"{U0}::2")),
            "ml/a": PodAllocation("ml", "a", (f"{U0}::0", "GPU-gone")),
            "ml/c": PodAllocation("ml", "c")}
    assert pods_by_gpu(pods, GPUS) == {0: ["ml/a", "ml/b"]}
    assert unmatched_devices(pods, GPUS) == ["GPU-gone"]
