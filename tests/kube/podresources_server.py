"""A test kubelet PodResources server: grpclib on a unix socket, speaking the kubelet's own v1 proto (package
`v1`, service `PodResourcesLister`), with the kubelet's rate limit (a token bucket) and an older kubelet's
UNIMPLEMENTED `Get`."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

from agent.podresources import api_pb2 as pb
from agent.podresources.api_grpc import PodResourcesListerBase


@dataclass
class Container:
    name: str
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource name -> device ids


@dataclass
class Pod:
    namespace: str
    name: str
    containers: list[Container] = field(default_factory=list)

    def message(self) -> pb.PodResources:
        return pb.PodResources(name=self.name, namespace=self.namespace, containers=[
            pb.ContainerResources(name=c.name, cpu_ids=[0], devices=[
                pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in c.devices.items()])
            for c in self.containers])


def gpu_pod(namespace: str, name: str, *devices: str, resource: str = "nvidia.com/gpu") -> Pod:
    return Pod(namespace, name, [Container("main", {resource: list(devices)} if devices else {})])


class FakeKubelet(PodResourcesListerBase):
    """What the kubelet answers; `qps`/`burst` as its limiter (kubelet default 100/s, burst 10)."""

    def __init__(self, pods: Sequence[Pod] = (), allocatable: dict[str, list[str]] | None = None, *,
                 get_served: bool = True, qps: float = 100.0, burst: int = 10) -> None:
        self.pods = list(pods)
        self.allocatable = allocatable or {}
        self.get_served = get_served
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._at = time.monotonic()
        self.calls: list[str] = []
        self.refused = 0
        self.unlisted: set[str] = set()  # pods List leaves out (admitted after it) but Get finds

    def _admit(self, method: str) -> None:
        now = time.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
        self._at = now
        self.calls.append(method)
        if self._tokens < 1:
            self.refused += 1
            raise GRPCError(Status.RESOURCE_EXHAUSTED, "rejected by rate limit")
        self._tokens -= 1

    async def List(self, stream: Stream[pb.ListPodResourcesRequest, pb.ListPodResourcesResponse]) -> None:
        await stream.recv_message()
        self._admit("List")
        await stream.send_message(pb.ListPodResourcesResponse(pod_resources=[
            p.message() for p in self.pods if f"{p.namespace}/{p.name}" not in self.unlisted]))

    async def GetAllocatableResources(
            self, stream: Stream[pb.AllocatableResourcesRequest, pb.AllocatableResourcesResponse]) -> None:
        await stream.recv_message()
        self._admit("GetAllocatableResources")
        await stream.send_message(pb.AllocatableResourcesResponse(devices=[
            pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in self.allocatable.items()]))

    async def Get(self, stream: Stream[pb.GetPodResourcesRequest, pb.GetPodResourcesResponse]) -> None:
        req = await stream.recv_message()
        assert req is not None
        if not self.get_served:
            raise GRPCError(Status.UNIMPLEMENTED, "unknown method Get for service v1.PodResourcesLister")
        self._admit("Get")
        for p in self.pods:
            if (p.namespace, p.name) == (req.pod_namespace, req.pod_name):
                await stream.send_message(pb.GetPodResourcesResponse(pod_resources=p.message()))
                return
        raise GRPCError(Status.NOT_FOUND, f"pod {req.pod_name} not found in namespace {req.pod_namespace}")


async def serve(kubelet: FakeKubelet, socket: Path) -> Server:
    server = Server([kubelet])
    await server.start(path=str(socket))
    return server


def main() -> None:
    """`python -m tests.kube.podresources_server SOCKET '[["ns", "pod", "device-id", ...], ...]'`: a kubelet in
    its own process (a test kills it to take the kubelet away, connections and all); prints `ready`."""
    import asyncio
    import json
    import sys

    async def run() -> None:
        pods = [gpu_pod(ns, name, *devices) for ns, name, *devices in json.loads(sys.argv[2])]
        await serve(FakeKubelet(pods), Path(sys.argv[1]))
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":
    main()
