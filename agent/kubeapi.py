"""The owner walk's reads: any kind by its ownerReference (CRDs too, by the kind table's plural), through the
agent's aiohttp reader or lightkube; a 404 is "does not exist", anything else the API refuses Unreadable (the walk
stops there)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agent.kubeget import KubeReader, KubeReadError, Unsupported, object_path
from agent.kubeowners import Fetch, Meta, Unreadable, meta_of
from gpuevents.config import KubernetesConfig
from gpuevents.kubekinds import kind_of

if TYPE_CHECKING:
    from lightkube import AsyncClient

#: the longest one read may take
TIMEOUT_S = 10.0


def lightkube_fetch(client: AsyncClient) -> Fetch:
    """A Fetch reading through `client` (read-only: get, nothing else)."""
    import httpx2
    from lightkube import ApiError

    from gpuevents.kube import resource_for

    resources: dict[tuple[str, str], Any] = {}

    async def fetch(api_version: str, kind: str, namespace: str, name: str) -> Meta | None:
        res = resources.get((api_version, kind))
        if res is None:
            res = resources[(api_version, kind)] = resource_for(api_version, kind)
        try:
            kw = {"namespace": namespace} if namespace else {}
            obj = await asyncio.wait_for(client.get(res, name, **kw), TIMEOUT_S)
        except ApiError as e:
            code = e.status.code or e.response.status_code
            if code == 404:
                return None
            hint = "; the agent's ClusterRole needs `get` on it (docs/kubernetes.md)" if code == 403 else ""
            raise Unreadable(f"HTTP {code} {e.status.reason or ''}: {e.status.message or e}{hint}") from None
        except (httpx2.HTTPError, TimeoutError, OSError) as e:
            raise Unreadable(f"{type(e).__name__}: {e}") from None
        return meta_of(obj.to_dict(), api_version, kind)

    return fetch


def reader_fetch(reader: KubeReader) -> Fetch:
    """A Fetch reading through the agent's aiohttp reader (agent/kubeget.py)."""

    async def fetch(api_version: str, kind: str, namespace: str, name: str) -> Meta | None:
        k = kind_of(api_version, kind)
        plural = "namespaces" if (kind, api_version) == ("Namespace", "v1") else k.plural
        try:
            obj = await reader.get(object_path(k.group, k.version, plural, namespace, name))
        except KubeReadError as e:
            if e.code is None:
                raise Unreadable(str(e)) from None
            hint = "; the agent's ClusterRole needs `get` on it (docs/kubernetes.md)" if e.code == 403 else ""
            raise Unreadable(f"HTTP {e.code} {e.reason}: {e}{hint}") from None
        return None if obj is None else meta_of(obj, api_version, kind)

    return fetch


def open_fetch(cfg: KubernetesConfig) -> tuple[Fetch, Callable[[], Awaitable[None]]]:
    """The owner walk's reads and how to close them: the aiohttp reader, else (a kubeconfig with credential
    plugins) lightkube. KubeConfigError when no configuration can be read."""
    try:
        reader = KubeReader.from_config(cfg)
    except Unsupported:
        from gpuevents.kube import make_client

        client = make_client(cfg)
        return lightkube_fetch(client), client.close
    return reader_fetch(reader), reader.close
