"""What a node's core is told from outside its readings at each sample: frozen, built by the agent's shell from
what its helpers last learnt (the Kubernetes node, the kubelet's allocation, the scheduler's job mapping)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.jobdetails import JobDetails
from agent.kubeowners import PodJob
from agent.podalloc import PodAllocation


@dataclass(frozen=True, slots=True)
class NodeInputs:
    """The changing inputs of one node's core, as of one sample."""

    labels: Mapping[str, str] = field(default_factory=dict)
    """The node's labels: the Kubernetes node's under the configured ones."""
    cordoned: bool | None = None
    """Known only from the Kubernetes node (agent.kubernetes_node)."""
    job_gpus: Mapping[str, list[str]] | None = None
    """The scheduler's allocation, GPU key (`3`) -> its jobs, from the HPC job mapping directory; None without one
    (then `allocated` is unknown)."""
    job_details: Callable[[str], JobDetails | None] | None = None
    """What the scheduler says of a job (agent/jobdetails.py), or None where unknown."""
    kube_pods: Mapping[str, PodAllocation] | None = None
    """The kubelet's allocation (PodResources List): every pod on the node by `namespace/name`, with its GPU
    devices; None without it (then `allocated` is unknown)."""
    kube_jobs: Mapping[str, PodJob] = field(default_factory=dict)
    """The job of each pod holding GPUs here (`namespace/name` -> its top owner), from the owner walk."""
    power_caps: Callable[[int], tuple[float, float | None] | None] | None = None
    """The power cap on a GPU and its draw before the cap (agent/powercap.py), or None."""
    diag_fields: Callable[[], dict[str, Any]] | None = None
    """The node's latest diagnostic result (agent/diagnose.py), for its snapshots."""
