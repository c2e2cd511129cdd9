"""GPUs waiting to be allocated, from what the schedulers say: Slurm's pending jobs (`squeue`), Kubernetes'
pending pods; each reduced to `DemandEntry`s per partition, node pool and GPU model."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpuevents.events import DemandEntry

SQUEUE_PENDING_ARGS = ("-h", "-t", "PENDING", "-o", "%i|%P|%D|%V|%b")
"""`squeue` arguments for the pending jobs: id, partition(s), node count, submit time, GRES per node."""

POOL_LABELS = ("pool", "cloud.google.com/gke-nodepool", "eks.amazonaws.com/nodegroup", "karpenter.sh/nodepool",
               "kubernetes.azure.com/agentpool")
"""Node labels that name a node's pool, in the order they are looked for (on a node, or a pod's nodeSelector)."""
MODEL_LABEL = "nvidia.com/gpu.product"
"""GPU feature discovery's label for the GPU model."""
_GRES_GPU = re.compile(r"^(?:gres[:/])?gpu(?::([A-Za-z0-9_.-]+?))?(?::(\d+))?(?:\(.*\))?$")


def gres_gpus(gres: str) -> tuple[int, str | None]:
    """GPUs per node in Slurm's GRES text (`gres:gpu:2`, `gres/gpu:a100:4`, `gpu`, several comma-separated)
    and the GPU type when one is named; (0, None) when it asks for none."""
    total, kind = 0, None
    for item in gres.split(","):
        m = _GRES_GPU.match(item.strip())
        if m is None:
            continue
        name, count = m.group(1), m.group(2)
        if name is not None and name.isdigit() and count is None:  # `gpu:2`: a count, not a type
            name, count = None, name
        total += int(count) if count is not None else 1
        kind = kind or name
    return total, kind


def _submitted(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.strip()).astimezone(UTC)  # squeue prints local time
    except ValueError:
        return None


def _add(acc: dict[tuple[str, str], tuple[int, datetime | None]], key: tuple[str, str], gpus: int,
         since: datetime | None) -> None:
    n, old = acc.get(key, (0, None))
    acc[key] = (n + gpus, min((t for t in (old, since) if t is not None), default=None))


def _entries(acc: Mapping[tuple[str, str], tuple[int, datetime | None]]) -> list[DemandEntry]:
    """One entry per (kind, name); kind `cluster` is the entry with no partition, pool or model: the whole
    cluster, each waiting job counted once."""
    return [DemandEntry(**({kind: name} if kind != "cluster" else {}), pending_gpus=n, waiting_since=since)
            for (kind, name), (n, since) in sorted(acc.items())]


def slurm_pending(text: str) -> tuple[list[DemandEntry], int]:
    """squeue's pending jobs (SQUEUE_PENDING_ARGS) as entries per partition and per GPU type; and how many
    lines were not understood (counted, never guessed at)."""
    acc: dict[tuple[str, str], tuple[int, datetime | None]] = {}
    bad = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != 5 or not fields[0].strip() or not fields[2].strip().isdigit():
            bad += 1
            continue
        _, partitions, nodes, submitted, gres = fields
        per_node, kind = gres_gpus(gres)
        gpus = per_node * max(1, int(nodes))
        if gpus == 0:
            continue
        since = _submitted(submitted)
        for p in partitions.split(","):
            if p.strip():
                _add(acc, ("partition", p.strip()), gpus, since)
        if kind is not None:
            _add(acc, ("model", kind), gpus, since)
        _add(acc, ("cluster", ""), gpus, since)
    return _entries(acc), bad


def pod_gpus(spec: Mapping[str, Any]) -> tuple[int, str | None]:
    """GPUs a pod asks for: `nvidia.com/gpu`, or a MIG slice `nvidia.com/mig-<profile>` (its profile the model)."""
    total, mig = 0, None
    for c in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        res = c.get("resources") or {}
        asked = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        for name, value in asked.items():
            if name == "nvidia.com/gpu" or name.startswith("nvidia.com/mig-"):
                try:
                    n = int(str(value))
                except ValueError:
                    continue
                total += n
                if name.startswith("nvidia.com/mig-"):
                    mig = name.removeprefix("nvidia.com/")
    return total, mig


def kubernetes_pending(pods: Iterable[Mapping[str, Any]]) -> list[DemandEntry]:
    """Pending pods (API objects as dicts) asking for GPUs, as entries per node pool and GPU model (the pool
    and model their nodeSelector asks for; a MIG slice's profile is its model)."""
    acc: dict[tuple[str, str], tuple[int, datetime | None]] = {}
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Pending":
            continue
        spec = pod.get("spec") or {}
        if spec.get("nodeName"):
            continue  # bound to a node already: not waiting for an allocation
        gpus, mig = pod_gpus(spec)
        if gpus == 0:
            continue
        created = (pod.get("metadata") or {}).get("creationTimestamp")
        since = _submitted(created) if isinstance(created, str) else created if isinstance(created, datetime) else None
        selector = spec.get("nodeSelector") or {}
        pool = next((selector[k] for k in POOL_LABELS if selector.get(k)), None)
        model = mig or selector.get(MODEL_LABEL)
        if pool is not None:
            _add(acc, ("pool", pool), gpus, since)
        if model is not None:
            _add(acc, ("model", model), gpus, since)
        _add(acc, ("cluster", ""), gpus, since)
    return _entries(acc)
