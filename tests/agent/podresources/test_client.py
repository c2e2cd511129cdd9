"""The kubelet's PodResources API through grpclib, against a server speaking the kubelet's own proto on a unix
socket: device ids as the NVIDIA device plugin reports them, pods without GPUs, Get and an older kubelet's
UNIMPLEMENTED, the kubelet's rate limit, and a missing socket (allocations unknown, said once)."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agent.podalloc import PodAllocation, gpu_of_device, pods_by_gpu, unmatched_devices
from agent.podresources.client import PodResources
from agent.sample import GpuReading
from tests.kube.podresources_server import FakeKubelet, gpu_pod, serve

U0 = "GPU-11111111-2222-3333-4444-555555555555"
U1 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
M2 = "MIG-0f0f0f0f-1111-2222-3333-444444444444"
GPUS = [GpuReading(index=0, uuid=U0), GpuReading(index=1, uuid=U1),
        GpuReading(index=2, uuid=M2, mig_parent=U1, mig_gi_id=7)]
RES = ["nvidia.com/gpu", "nvidia.com/mig-"]


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kl"))  # a unix socket path must stay under 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def kubelet(sock_dir: Path) -> AsyncIterator[tuple[FakeKubelet, Path]]:
    k = FakeKubelet([
        gpu_pod("team-a", "train-0", U0),
        gpu_pod("team-b", "notebook", f"{U1}::0"),       # time-sliced replicas of one GPU
        gpu_pod("team-c", "serve", f"{U1}::3", resource="nvidia.com/gpu.shared"),
        gpu_pod("team-d", "mig", M2, resource="nvidia.com/mig-1g.10gb"),
        gpu_pod("kube-system", "coredns"),                # a pod with no devices
    ], allocatable={"nvidia.com/gpu": [U0, f"{U1}::0", f"{U1}::1"], "example.com/nic": ["eth1"]})
    server = await serve(k, sock_dir / "kubelet.sock")
    yield k, sock_dir / "kubelet.sock"
    server.close()
    await server.wait_closed()


def test_device_ids_of_the_device_plugin_name_this_nodes_gpus() -> None:
    assert gpu_of_device(U0, GPUS) == 0
    assert gpu_of_device(f"{U1}::5", GPUS) == 1            # a time-sliced replica is its GPU
    assert gpu_of_device(M2, GPUS) == 2                    # a MIG device by its own UUID
    assert gpu_of_device(f"MIG-{U1}/7/0", GPUS) == 2       # a MIG device as drivers before R470 named it
    assert gpu_of_device("1", GPUS) == 1                   # deviceIDStrategy: index
    assert gpu_of_device("GPU-00000000-0000-0000-0000-000000000000", GPUS) is None
    pods = {"a/x": PodAllocation("a", "x", (U0, "GPU-gone"))}
    assert unmatched_devices(pods, GPUS) == ["GPU-gone"]


async def test_list_gives_each_gpu_its_pods_and_keeps_pods_without_gpus(kubelet: tuple[FakeKubelet, Path]) -> None:
    k, sock = kubelet
    pr = PodResources(sock, RES)
    try:
        assert await pr.refresh() == pr.refresh_s
    finally:
        pr.close()
    assert pr.pods is not None
    assert pr.pods["kube-system/coredns"].devices == ()
    assert pods_by_gpu(pr.pods, GPUS) == {0: ["team-a/train-0"], 1: ["team-b/notebook", "team-c/serve"],
                                          2: ["team-d/mig"]}
    assert pr.allocatable == (U0, f"{U1}::0", f"{U1}::1")  # the NIC is not a GPU
    assert k.calls == ["List", "GetAllocatableResources"]


async def test_get_is_used_where_served_and_unimplemented_is_remembered(
        kubelet: tuple[FakeKubelet, Path], caplog: pytest.LogCaptureFixture) -> None:
    k, sock = kubelet
    pr = PodResources(sock, RES)
    try:
        got = await pr.get("team-a", "train-0")
        assert got == PodAllocation("team-a", "train-0", (U0,))
        assert await pr.get("team-a", "nope") is None
        assert pr.get_served is True
        k.unlisted.add("team-a/train-0")  # admitted after List: a process on its GPU is seen, Get finds it
        pr.wanted = {"team-a/train-0"}
        await pr.refresh()
        assert pr.pods is not None and pr.pods["team-a/train-0"].devices == (U0,)
        # processes in pods the kubelet does not know: a few Gets per refresh, each such pod asked once
        pr.wanted = {f"x/ghost-{i}" for i in range(8)}
        k.qps, k.burst, k._tokens = 1e6, 1000, 1000.0  # this part is about Get, not the rate limit
        before = k.calls.count("Get")
        await pr.refresh()
        await pr.refresh()
        await pr.refresh()
        assert k.calls.count("Get") - before == 8 and k.refused == 0
        assert pr.pods is not None and "kube-system/coredns" in pr.pods and "x/ghost-0" not in pr.pods
        k.get_served = False  # an older kubelet
        caplog.set_level(logging.INFO)
        assert await pr.get("team-a", "train-0") is None
        assert pr.get_served is False
        calls = len(k.calls)
        assert await pr.get("team-a", "train-0") is None  # not asked again
        assert len(k.calls) == calls
    finally:
        pr.close()
    assert "does not serve PodResources Get" in caplog.text


async def test_the_kubelets_rate_limit_backs_off_and_keeps_the_last_answer(
        kubelet: tuple[FakeKubelet, Path]) -> None:
    k, sock = kubelet
    k.qps, k.burst = 0.001, 2  # two calls, then RESOURCE_EXHAUSTED for a long while
    k._tokens = 2.0
    pr = PodResources(sock, RES, refresh_s=0.5)
    try:
        assert await pr.refresh() == 0.5
        assert pr.pods is not None and "team-a/train-0" in pr.pods
        first = await pr.refresh()
        second = await pr.refresh()
    finally:
        pr.close()
    assert k.refused == 2 and pr.rate_limited == 2
    assert first >= 1.0 and second == 2 * first   # doubling, never faster than the refresh
    assert pr.pods is not None and "team-a/train-0" in pr.pods  # a rate limit is no reason to forget


async def test_a_missing_socket_makes_allocations_unknown_and_is_said_once(
        sock_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    pr = PodResources(sock_dir / "absent.sock", RES)
    pr.pods = {"a/x": PodAllocation("a", "x", (U0,))}  # known before the kubelet went away
    caplog.set_level(logging.WARNING)
    try:
        for _ in range(3):
            await pr.refresh()
    finally:
        pr.close()
    assert pr.pods is None  # unknown, not "nothing allocated"
    said = [r for r in caplog.records if "socket" in r.getMessage()]
    assert len(said) == 1 and "absent.sock" in said[0].getMessage()
    assert pr.errors == 3
