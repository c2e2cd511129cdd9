"""This node's labels and cordon state from the Kubernetes API: GET /api/v1/nodes/<own name>, nothing else
(through the agent's aiohttp reader, agent/kubeget.py; lightkube where the kubeconfig needs a credential plugin)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agent.kubeget import KubeReader, KubeReadError, Unsupported
from gpuevents.config import Config

if TYPE_CHECKING:
    from lightkube import AsyncClient

# lightkube and its HTTP client are imported only when a lookup runs: an agent outside Kubernetes
# never loads them (a few MiB of the agent's memory budget).

log = logging.getLogger(__name__)

#: how often the Node object is read again
REFRESH_S = 60.0
#: the longest one read may take
TIMEOUT_S = 10.0


def in_pod() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def wanted(config: Config) -> bool:
    """`agent.kubernetes_node`, unset meaning: when the agent runs in a Kubernetes pod."""
    on = config.agent.kubernetes_node
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) if on is None else on


@dataclass
class KubeNodeInfo:
    """What the API said about the node last time it answered."""

    labels: dict[str, str] = field(default_factory=dict)
    cordoned: bool = False


def _make_client(config: Config) -> AsyncClient:
    from gpuevents.kube import make_client

    return make_client(config.actions.kubernetes)


class NodeLookup:
    """Reads the agent's own Node object; keeps the last good answer when the API fails."""

    def __init__(self, config: Config, node: str,
                 client_factory: Callable[[], AsyncClient] | None = None) -> None:
        self.node = node
        self._factory = client_factory or (lambda: _make_client(config))
        self._client: AsyncClient | None = None
        self._reader: KubeReader | None = None
        self._lightkube = client_factory is not None
        if not self._lightkube:
            try:
                self._reader = KubeReader.from_config(config.actions.kubernetes)
            except Unsupported:
                self._lightkube = True
        self.state: KubeNodeInfo | None = None
        self.errors = 0
        self._last_error = ""

    async def refresh(self) -> KubeNodeInfo | None:
        """Read the node now; the state (the previous one when this read failed)."""
        if self._reader is not None:
            try:
                got = await asyncio.wait_for(self._reader.get(f"/api/v1/nodes/{self.node}"), TIMEOUT_S)
            except (KubeReadError, TimeoutError) as e:
                code = getattr(e, "code", None)
                self._say(f"{e} (HTTP {code})" if code else f"{type(e).__name__}: {e}", code)
                return self.state
            if got is None:
                self._say(f"nodes \"{self.node}\" not found (HTTP 404)", 404)
                return self.state
            md, spec = got.get("metadata") or {}, got.get("spec") or {}
            return self._got(dict(md.get("labels") or {}), bool(spec.get("unschedulable")))
        return await self._refresh_lightkube()

    async def _refresh_lightkube(self) -> KubeNodeInfo | None:
        import httpx2
        from lightkube import ApiError, ConfigError
        from lightkube.resources.core_v1 import Node

        from gpuevents.kube import KubeConfigError

        try:
            if self._client is None:
                self._client = self._factory()
            obj = await asyncio.wait_for(self._client.get(Node, name=self.node), TIMEOUT_S)
        except (ApiError, httpx2.HTTPError, ConfigError, KubeConfigError, TimeoutError, OSError) as e:
            self._failed(e)
            return self.state
        labels = dict(obj.metadata.labels or {}) if obj.metadata else {}
        cordoned = bool(obj.spec.unschedulable) if obj.spec else False
        return self._got(labels, cordoned)

    def _got(self, labels: dict[str, str], cordoned: bool) -> KubeNodeInfo:
        if self._last_error:
            log.info("kubernetes node %s is readable again", self.node)
            self._last_error = ""
        self.state = KubeNodeInfo(labels=labels, cordoned=cordoned)
        return self.state

    def _failed(self, e: Exception) -> None:
        from lightkube import ApiError

        if isinstance(e, ApiError):
            code = e.status.code or e.response.status_code
            self._say(f"{e.status.message or e} (HTTP {code})", code)
        else:
            self._say(f"{type(e).__name__}: {e}", None)

    def _say(self, why: str, code: int | None) -> None:
        self.errors += 1
        if code == 403:
            why += "; the agent's service account needs `get` on nodes (deploy/kubernetes/rbac.yaml)"
        if why != self._last_error:  # once per kind of failure, not every minute
            log.warning("cannot read kubernetes node %s: %s; keeping what was known", self.node, why)
        self._last_error = why

    async def close(self) -> None:
        if self._reader is not None:
            await self._reader.close()
        if self._client is not None:
            await self._client.close()
            self._client = None
