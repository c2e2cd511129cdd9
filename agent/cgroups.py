"""Container id, Kubernetes pod uid and Slurm job id from `/proc/<pid>/cgroup` (cgroup v1 and v2; docker,
containerd, cri-o, podman; Slurm's cgroup plugins)."""

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


# Slurm's cgroup plugins: v1 `/slurm/uid_<uid>/job_<id>/step_<s>`, v2 `/system.slice/slurmstepd.scope/job_<id>/...`
_SLURM_JOB = re.compile(r"/slurm[^/]*/(?:uid_\d+/)?job_(\d+)(?:/|$)")


@dataclass(frozen=True, slots=True)
class CgroupInfo:
    container_id: str | None = None
    pod_uid: str | None = None
    slurm_job: str | None = None


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
    job: str | None = None
    for path in paths:
        if job is None:
            m = _SLURM_JOB.search(path)
            if m:
                job = m.group(1)
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
        if container is not None and pod is not None:
            break
    return CgroupInfo(container_id=container, pod_uid=pod, slurm_job=job)


def read_cgroup(pid: int, proc_root: Path = Path("/proc")) -> CgroupInfo:
    """`parse_cgroup` of a live process; empty when it cannot be read."""
    try:
        return parse_cgroup((proc_root / str(pid) / "cgroup").read_text())
    except OSError:
        return CgroupInfo()
