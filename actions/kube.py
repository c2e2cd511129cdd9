"""Kubernetes for the actions: the contract's client, with its errors mapped to the runner's retry rules."""

from __future__ import annotations

import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient, ConfigError

from actions.errors import PermanentError, TransientError
from gpuevents import kube
from gpuevents.config import KubernetesConfig


def make_client(cfg: KubernetesConfig) -> AsyncClient:
    """The shared client (gpuevents.kube); a configuration that cannot be read is a PermanentError."""
    try:
        return kube.make_client(cfg)
    except kube.KubeConfigError as e:
        raise PermanentError(str(e)) from None


TRANSIENT_CODES = (403, 409, 429)


@contextmanager
def kube_errors(what: str) -> Iterator[None]:
    """API errors as the runner wants them (actions/convergence.py): 403 (rights are granted without a restart), 409,
    429, 5xx and the network transient; 404 and any other 4xx permanent."""
    try:
        yield
    except ApiError as e:
        code = e.status.code or e.response.status_code
        msg = f"{what}: {e.status.message or e} (HTTP {code})"
        if code in TRANSIENT_CODES or code >= 500:
            raise TransientError(msg) from None
        raise PermanentError(msg) from None
    except httpx2.HTTPStatusError as e:  # an error page that is not a Kubernetes Status (a proxy)
        code = e.response.status_code
        msg = f"{what}: HTTP {code}"
        if code in TRANSIENT_CODES or code >= 500:
            raise TransientError(msg) from None
        raise PermanentError(msg) from None
    except httpx2.TransportError as e:
        raise TransientError(f"{what}: {type(e).__name__}: {e}") from None
    except ConfigError as e:
        raise PermanentError(f"{what}: kubernetes configuration: {e}") from None


async def post_event(client: AsyncClient, obj: Mapping[str, Any], reason: str, message: str, *,
                     warning: bool = False, now: datetime | None = None) -> str | None:
    """A core/v1 Event on `obj` (a dict with apiVersion, kind and metadata), as `kubectl describe` shows it;
    None when posted, else why not (an Event is a courtesy: the action's outcome does not depend on it)."""
    from lightkube.models.core_v1 import EventSource, ObjectReference
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Event

    md = obj.get("metadata") or {}
    at = now or datetime.now(UTC)
    event = Event(
        metadata=ObjectMeta(generateName=f"{md.get('name', 'gpuevents')}.", namespace=md.get("namespace")),
        involvedObject=ObjectReference(apiVersion=obj.get("apiVersion"), kind=obj.get("kind"),
                                       name=md.get("name"), namespace=md.get("namespace"), uid=md.get("uid"),
                                       resourceVersion=md.get("resourceVersion")),
        reason=reason, message=message[:1024], type="Warning" if warning else "Normal",
        source=EventSource(component="gpuevents"), reportingComponent="gpuevents",
        reportingInstance=socket.gethostname()[:128], firstTimestamp=at, lastTimestamp=at, count=1,
    )
    try:
        await client.create(event)  # into metadata.namespace (lightkube's typed overload takes no namespace=)
    except ApiError as e:
        return f"no Event posted: {e.status.message or e} (HTTP {e.status.code or e.response.status_code})"
    except httpx2.HTTPError as e:
        return f"no Event posted: {type(e).__name__}: {e}"
    return None
