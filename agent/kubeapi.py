"""The owner walk's reads through lightkube: any kind by its ownerReference (generic resources for CRDs), a 404
as "does not exist", everything else the API refuses as Unreadable (the walk stops there)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from agent.kubeowners import Fetch, Meta, Unreadable, meta_of

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
