"""Asks the kubelet's PodResources API (grpclib over its unix socket) which pods hold which GPUs, and keeps the
last answer: unknown (None) while the socket is missing or the kubelet fails; backs off when it rate-limits."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

from agent.podalloc import PodAllocation, allocatable_devices, parse_list, pod_allocation
from agent.podresources import api_pb2
from agent.podresources.api_grpc import PodResourcesListerStub
from gpuevents.aio import Backoff

log = logging.getLogger(__name__)

#: how long a refresh waits once the kubelet said RESOURCE_EXHAUSTED, doubling up to the cap
RATE_LIMIT_BACKOFF_S = 1.0
RATE_LIMIT_BACKOFF_MAX_S = 60.0
#: the allocations are kept this many refresh intervals after the kubelet stopped answering, then unknown
STALE_AFTER_REFRESHES = 3
#: at most this many pods are asked for with Get per refresh (the kubelet's burst is 10 calls)
MAX_GETS_PER_REFRESH = 3
#: a pod Get did not find is not asked for again for this long (a process whose pod the kubelet does not know)
ABSENT_FOR_S = 300.0


class PodResources:
    """One node's allocations as the kubelet reports them; `pods` is None while they are unknown."""

    def __init__(self, socket: Path, resources: list[str], *, refresh_s: float = 10.0, timeout_s: float = 5.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.socket = socket
        self.resources = list(resources)
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self._monotonic = monotonic
        self.pods: dict[str, PodAllocation] | None = None
        self.allocatable: tuple[str, ...] | None = None
        self.get_served: bool | None = None  # None until Get was tried; False on UNIMPLEMENTED (older kubelets)
        self.wanted: set[str] = set()
        """Pods (`namespace/name`) the agent saw holding a GPU: one the last List missed (started since) is
        asked for with Get, where the kubelet serves it, rather than waiting for the next List."""
        self._absent: dict[str, float] = {}  # pod -> when Get did not find it
        self.errors = 0
        self.rate_limited = 0
        self._ok_at: float | None = None
        self._backoff = Backoff(RATE_LIMIT_BACKOFF_S, RATE_LIMIT_BACKOFF_MAX_S, jitter=False)
        self._delay = refresh_s
        self._channel: Channel | None = None
        self._stub: PodResourcesListerStub | None = None
        self._said = ""

    # ------------------------------------------------------------ the calls
    def _lister(self) -> PodResourcesListerStub:
        if self._stub is None:
            self._channel = Channel(path=str(self.socket))
            self._stub = PodResourcesListerStub(self._channel)
        return self._stub

    async def list(self) -> dict[str, PodAllocation]:
        resp = await self._lister().List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        return parse_list(resp.pod_resources, self.resources)

    async def list_allocatable(self) -> tuple[str, ...]:
        resp = await self._lister().GetAllocatableResources(api_pb2.AllocatableResourcesRequest(),
                                                            timeout=self.timeout_s)
        return allocatable_devices(resp.devices, self.resources)

    async def get(self, namespace: str, name: str) -> PodAllocation | None:
        """One pod (kubelets from 1.27 serve Get); None where Get is not served or the pod is not there."""
        if self.get_served is False:
            return None
        try:
            resp = await self._lister().Get(api_pb2.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace),
                                            timeout=self.timeout_s)
        except GRPCError as e:
            if e.status == Status.UNIMPLEMENTED:
                self.get_served = False
                log.info("the kubelet does not serve PodResources Get (before 1.27): new pods wait for the next "
                         "List")
                return None
            if e.status == Status.NOT_FOUND:
                self.get_served = True
                return None
            raise
        self.get_served = True
        return pod_allocation(resp.pod_resources, self.resources)

    # ------------------------------------------------------------ the loop's step
    async def refresh(self) -> float:
        """List again (and the allocatable devices the first time); the seconds to wait before the next refresh."""
        now = self._monotonic()
        try:
            pods = await self.list()
            if self.allocatable is None:
                self.allocatable = await self.list_allocatable()
            await self._get_missing(pods, now)
        except GRPCError as e:
            self.errors += 1
            if e.status == Status.RESOURCE_EXHAUSTED:
                self.rate_limited += 1
                self._delay = max(self.refresh_s, self._backoff.next())
                self._say(f"the kubelet rate-limits PodResources (RESOURCE_EXHAUSTED); next try in {self._delay:g}s")
            else:
                self._failed(now, f"the kubelet answered PodResources with {e.status.name}: {e.message}")
            return self._delay
        except (FileNotFoundError, ConnectionRefusedError) as e:
            self.errors += 1
            self._forget_channel()
            self._failed(now, f"the kubelet's PodResources socket {self.socket} cannot be reached ({e.strerror}): "
                         "GPU allocations are unknown until it can; mount /var/lib/kubelet/pod-resources into the "
                         "agent's pod (docs/kubernetes.md)", stale=False)
            return self.refresh_s
        except (OSError, StreamTerminatedError, TimeoutError) as e:
            self.errors += 1
            self._forget_channel()
            self._failed(now, f"PodResources List failed: {type(e).__name__}: {e}")
            return self.refresh_s
        if self._said:
            log.info("the kubelet's PodResources answers again (%d pods)", len(pods))
            self._said = ""
        self.pods = pods
        self._ok_at = now
        self._backoff.reset()
        self._delay = self.refresh_s
        return self._delay

    async def _get_missing(self, pods: dict[str, PodAllocation], now: float) -> None:
        """Get the wanted pods List missed (a few per refresh; not again soon for one the kubelet does not know);
        a failing Get leaves List's answer as it is."""
        self._absent = {k: t for k, t in self._absent.items() if now - t < ABSENT_FOR_S}
        missing = sorted(k for k in self.wanted - set(pods) if k not in self._absent)
        for key in missing[:MAX_GETS_PER_REFRESH]:
            namespace, _, name = key.partition("/")
            try:
                got = await self.get(namespace, name)
            except (GRPCError, OSError, StreamTerminatedError, TimeoutError) as e:
                log.debug("PodResources Get %s: %s", key, e)
                return
            if got is None:
                self._absent[key] = now
            else:
                pods[key] = got

    def _failed(self, now: float, why: str, *, stale: bool = True) -> None:
        """Keep the last answer for a few intervals (a blip), then say the allocations are unknown."""
        if not stale or self._ok_at is None or now - self._ok_at > STALE_AFTER_REFRESHES * self.refresh_s:
            self.pods = None
        self._say(why)

    def _say(self, why: str) -> None:
        if why != self._said:  # once per kind of failure, not every refresh
            log.warning("%s", why)
            self._said = why

    def _forget_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None

    def close(self) -> None:
        self._forget_channel()
