"""Container id and Kubernetes pod uid from `/proc/<pid>/cgroup` (cgroup v1 and v2; docker, containerd, cri-o,
podman)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# The last path element names the container: a bare 64-hex id (cgroupfs driver) or a systemd
# scope `<runtime>-<id>.scope`. `crio-conmon-<id>` is CRI-O's monitor process, not the container.
_CONTAINER = re.compile(
    r"^(?:docker-|cri-containerd-|crio-|libpod-|containerd-)?([0-9a-f]{64})(?:\.scope)?$"
)
# `pod<uid>` as a path element (cgroupfs) or inside a slice name, with '_' for '-' (systemd).
_POD = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?(?:/|$)"
)


# A system unit: `/system.slice/<unit>.service` (or `.scope`, e.g. `slurmstepd.scope`), nested slices allowed.
_SYSTEM_UNIT = re.compile(r"^/system\.slice/(?:[^/]+\.slice/)*([^/]+\.(?:service|scope))(?:/|$)")
# Slurm's cgroup v1 layout: `/slurm/uid_<uid>/job_<id>/step_<id>` (or `/slurm_<node>/…`).
_SLURM_V1 = re.compile(r"^/slurm[^/]*/uid_\d+/job_\d+")
# The job in either layout: v1 above, v2 `…/slurmstepd.scope/job_<id>/step_<id>/…`.
_SLURM_JOB = re.compile(r"^/(?:slurm[^/]*/uid_\d+|(?:[^/]+/)*slurmstepd[^/]*\.scope)/job_(\d+)(?:/|$)")


@dataclass(frozen=True, slots=True)
class CgroupInfo:
    container_id: str | None = None
    pod_uid: str | None = None
    job: str | None = None
    """The Slurm job the process runs in (its id), from the job's cgroup."""
    service: str | None = None
    """The system unit that runs the process (`nvidia-dcgm.service`, `slurmstepd.scope`; `slurm` for Slurm's
    cgroup v1 tree), or None: a login session's process (`user.slice`) has none."""


def parse_cgroup(text: str) -> CgroupInfo:
    """Read the container and pod of a process from the text of its `/proc/<pid>/cgroup`.

    Lines are `hierarchy-id:controllers:path`; cgroup v2 has the single line `0::path`. The first
    line that names a container or pod wins; the v2 line is looked at first.
    """
    paths: list[str] = []
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            paths.insert(0, parts[2])
        else:
            paths.append(parts[2])
    container: str | None = None
    pod: str | None = None
    service: str | None = None
    job: str | None = None
    for path in paths:
        if job is None:
            m = _SLURM_JOB.match(path)
            job = m.group(1) if m else None
        if service is None:
            m = _SYSTEM_UNIT.match(path)
            if m and not _CONTAINER.match(m.group(1)):  # a container's scope is a container, not a service
                service = m.group(1)
            elif _SLURM_V1.match(path):
                service = "slurm"
        if container is None:
            for element in reversed([e for e in path.split("/") if e]):
                m = _CONTAINER.match(element)
                if m:
                    container = m.group(1)
                    break
        if pod is None:
            m = _POD.search(path)
            if m:
                pod = m.group(1).replace("_", "-")
    return CgroupInfo(container_id=container, pod_uid=pod, service=service, job=job)


def read_cgroup(pid: int, proc_root: Path = Path("/proc")) -> CgroupInfo:
    """`parse_cgroup` of a live process; empty when it cannot be read."""
    try:
        return parse_cgroup((proc_root / str(pid) / "cgroup").read_text())
    except OSError:
        return CgroupInfo()
