"""The Kubernetes client for cordon and scale: lightkube from a kubeconfig or in-cluster, errors mapped."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import httpx2
from lightkube import ApiError, AsyncClient, ConfigError, KubeConfig

from actions.protocol import PermanentError, TransientError
from gpuevents.config import KubernetesConfig

FIELD_MANAGER = "gpuevents"


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def make_client(cfg: KubernetesConfig) -> AsyncClient:
    """A client for config `actions.kubernetes`: its kubeconfig (and context), in-cluster, or auto."""
    try:
        if cfg.kubeconfig is not None:
            config = KubeConfig.from_file(cfg.kubeconfig).get(context_name=cfg.context)
        elif cfg.in_cluster or (cfg.in_cluster is None and _in_cluster()):
            config = KubeConfig.from_service_account().get()
        else:
            config = KubeConfig.from_env().get(context_name=cfg.context)
    except ConfigError as e:
        raise PermanentError(f"kubernetes configuration: {e}") from None
    return AsyncClient(config=config, field_manager=FIELD_MANAGER, trust_env=False)


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
