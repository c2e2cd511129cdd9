"""The Kubernetes client shared by the agent (its Node) and the actions (cordon, scale): lightkube, configured
from config `actions.kubernetes`: a kubeconfig (and context), in-cluster, or auto."""

from __future__ import annotations

import os
from typing import Any

from lightkube import AsyncClient, ConfigError, KubeConfig

from gpuevents.config import KubernetesConfig
from gpuevents.kubekinds import kind_of

FIELD_MANAGER = "gpuevents"


class KubeConfigError(Exception):
    """The Kubernetes configuration cannot be read: retrying will not help."""


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def make_client(cfg: KubernetesConfig) -> AsyncClient:
    """A client for `cfg`; KubeConfigError when no configuration can be read."""
    try:
        if cfg.kubeconfig is not None:
            config = KubeConfig.from_file(cfg.kubeconfig).get(context_name=cfg.context)
        elif cfg.in_cluster or (cfg.in_cluster is None and in_cluster()):
            config = KubeConfig.from_service_account().get()
        else:
            config = KubeConfig.from_env().get(context_name=cfg.context)
    except ConfigError as e:
        raise KubeConfigError(f"kubernetes configuration: {e}") from None
    return AsyncClient(config=config, field_manager=FIELD_MANAGER, trust_env=False)


def resource_for(api_version: str, kind: str) -> Any:
    """A lightkube resource class for any kind: the typed one for core Pods, Namespaces and Events, else a generic
    (namespaced) resource named from the kind table (gpuevents.kubekinds), which works for CRDs too."""
    from lightkube.generic_resource import create_global_resource, create_namespaced_resource
    from lightkube.resources.core_v1 import Namespace, Pod

    if api_version == "v1" and kind == "Pod":
        return Pod
    if api_version == "v1" and kind == "Namespace":
        return Namespace
    k = kind_of(api_version, kind)
    make = create_global_resource if kind == "Namespace" else create_namespaced_resource
    return make(k.group, k.version, k.kind, k.plural)
