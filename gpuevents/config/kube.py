"""Configuration sections for the agent on Kubernetes: the kubelet's /pods (`agent.attribution.kubelet`), its
PodResources API (`agent.pod_resources`) and the owner walk that makes a pod's job (`agent.kubernetes_jobs`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from gpuevents.durations import Duration


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)  # as every section of gpuevents/config/__init__.py


class KubeletConfig(_Section):
    url: str | None = Field(None, description="e.g. https://127.0.0.1:10250; unset: no pod lookup")
    token_file: Path | None = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    ca_file: Path | None = None
    insecure_skip_verify: bool = False
    refresh: Duration = 30


class PodResourcesConfig(_Section):
    """The kubelet's PodResources API: which pod each GPU is allocated to."""

    enabled: bool | None = Field(None, description="unset: when the agent runs in a Kubernetes pod")
    socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    resources: list[str] = Field(default_factory=lambda: ["nvidia.com/gpu", "nvidia.com/mig-"],
                                 description="the extended resources that are GPUs; an entry ending in - or / "
                                 "is a prefix")
    refresh: Duration = Field(10, description="how often List is asked (the kubelet allows 100 calls/s)")
    timeout: Duration = 5


class KubernetesJobsConfig(_Section):
    """Kubernetes jobs: each pod holding GPUs resolved to its top owner through the API (read-only)."""

    owners: bool | None = Field(None, description="walk ownerReferences through the API; unset: when PodResources "
                                "is on. Off: a pod is its own job")
    user_annotation: str | None = Field(None, description="the annotation naming a workload's user (pod, then "
                                        "its top owner, then its namespace)")
    user_label: str | None = Field(None, description="the label naming it, when the annotation does not")
    owner_cache: Duration = Field(300, description="how long an owner chain is trusted before it is read again")
