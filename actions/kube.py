"""Kubernetes for the actions: the contract's client, with its errors mapped to the runner's retry rules."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx2
from lightkube import ApiError, AsyncClient, ConfigError

from actions.protocol import PermanentError, TransientError
from gpuevents import kube
from gpuevents.config import KubernetesConfig


def make_client(cfg: KubernetesConfig) -> AsyncClient:
    """The shared client (gpuevents.kube); a configuration that cannot be read is a PermanentError."""
    try:
        return kube.make_client(cfg)
    except kube.KubeConfigError as e:
        raise PermanentError(str(e)) from None


@contextmanager
def kube_errors(what: str) -> Iterator[None]:
    """API errors as the runner wants them: 404/4xx permanent; 409, 429, 5xx and the network transient."""
    try:
        yield
    except ApiError as e:
        code = e.status.code or e.response.status_code
        msg = f"{what}: {e.status.message or e} (HTTP {code})"
        if code in (409, 429) or code >= 500:
            raise TransientError(msg) from None
        raise PermanentError(msg) from None
    except httpx2.HTTPStatusError as e:  # an error page that is not a Kubernetes Status (a proxy)
        code = e.response.status_code
        msg = f"{what}: HTTP {code}"
        if code in (409, 429) or code >= 500:
            raise TransientError(msg) from None
        raise PermanentError(msg) from None
    except httpx2.TransportError as e:
        raise TransientError(f"{what}: {type(e).__name__}: {e}") from None
    except ConfigError as e:
        raise PermanentError(f"{what}: kubernetes configuration: {e}") from None
