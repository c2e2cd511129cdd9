"""Pod namespace, name, labels, annotations and container names by pod uid, from the kubelet's `/pods` endpoint."""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuevents.config.kube import KubeletConfig

if TYPE_CHECKING:  # aiohttp (~20 MiB) is loaded only where the kubelet's /pods is read
    import aiohttp

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PodMeta:
    uid: str
    namespace: str
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    containers: dict[str, str] = field(default_factory=dict)  # container id (bare hex) -> its name


class _Meta(BaseModel):
    model_config = ConfigDict(extra="ignore")
    uid: str
    namespace: str = "default"
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class _ContainerStatus(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    containerID: str | None = None  # the API spells it so; `containerd://<id>`, unset while pending


class _Status(BaseModel):
    model_config = ConfigDict(extra="ignore")
    containerStatuses: list[_ContainerStatus] | None = None
    initContainerStatuses: list[_ContainerStatus] | None = None


class _Pod(BaseModel):
    model_config = ConfigDict(extra="ignore")
    metadata: _Meta
    status: _Status | None = None

    def containers(self) -> dict[str, str]:
        st = self.status
        if st is None:
            return {}
        return {c.containerID.split("://", 1)[-1]: c.name
                for c in [*(st.initContainerStatuses or []), *(st.containerStatuses or [])] if c.containerID}


class _PodList(BaseModel):
    model_config = ConfigDict(extra="ignore")
    items: list[_Pod] | None = None


class KubeletError(Exception):
    """The kubelet could not be asked or answered with something that is not a pod list."""


def parse_pod_list(raw: bytes) -> dict[str, PodMeta]:
    try:
        pods = _PodList.model_validate_json(raw)
    except ValidationError as e:
        raise KubeletError(f"kubelet /pods answered something that is not a PodList: {e}") from None
    return {
        p.metadata.uid: PodMeta(uid=p.metadata.uid, namespace=p.metadata.namespace,
                                name=p.metadata.name, labels=p.metadata.labels,
                                annotations=p.metadata.annotations, containers=p.containers())
        for p in pods.items or []
    }


class PodDirectory:
    """The pods on this node, refreshed from the kubelet by `refresh()`; `get(uid)` never does I/O."""

    def __init__(self, config: KubeletConfig) -> None:
        if not config.url:
            raise ValueError("agent.attribution.kubelet.url is not set")
        self.config = config
        self.pods: dict[str, PodMeta] = {}
        self.errors = 0

    def get(self, uid: str) -> PodMeta | None:
        return self.pods.get(uid)

    def _headers(self) -> dict[str, str]:
        tf = self.config.token_file
        if tf is not None and tf.exists():
            return {"Authorization": f"Bearer {tf.read_text().strip()}"}
        return {}

    def _ssl(self) -> ssl.SSLContext | bool:
        if self.config.insecure_skip_verify:
            return False
        if self.config.ca_file is not None:
            return ssl.create_default_context(cafile=str(self.config.ca_file))
        return True

    async def refresh(self, session: aiohttp.ClientSession, timeout: float = 5.0) -> int:
        """Fetch `/pods`; the number of pods known. Keeps the previous list when the kubelet fails."""
        import aiohttp

        url = f"{str(self.config.url).rstrip('/')}/pods"
        try:
            async with session.get(url, headers=self._headers(), ssl=self._ssl(),
                                   timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status != 200:
                    raise KubeletError(f"kubelet {url} answered HTTP {resp.status}")
                self.pods = parse_pod_list(await resp.read())
        except (aiohttp.ClientError, TimeoutError, KubeletError) as e:
            self.errors += 1
            log.warning("cannot list pods from the kubelet (%s); keeping %d known pods", e, len(self.pods))
        return len(self.pods)
