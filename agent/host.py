"""What the agent knows of the host it runs on: in a container or not, the host's pid namespace or not, and
uid → user name from the host's user database, also when the agent runs in a container.

psutil names a uid through the agent's own `/etc/passwd`: in a container image that file does not hold the
host's users, so `protect.users`, `owners[user]` and `<user>@domain` would all miss (or, worse, match the wrong
name). In a container the agent reads the host's file instead: `/proc/1/root/etc/passwd` (the host's root, with
`hostPID`), else a mounted `/host/etc/passwd`. On the host itself it asks NSS (`pwd`), so LDAP/SSSD users resolve.
A uid that cannot be named stays unnamed (None): the engine refuses destructive actions on such a process.
"""

from __future__ import annotations

import logging
import os
import pwd
from pathlib import Path

from agent.cgroups import read_cgroup

log = logging.getLogger(__name__)

HOST_PASSWD_CANDIDATES = (Path("/host/etc/passwd"), Path("/proc/1/root/etc/passwd"))


def in_container(proc_root: Path = Path("/proc")) -> bool:
    """Whether this process runs in a container whose user database may not be the host's: in a Kubernetes pod,
    under podman, or with a cgroup that names a container."""
    if os.environ.get("KUBERNETES_SERVICE_HOST") or Path("/run/.containerenv").exists():
        return True
    cg = read_cgroup(os.getpid(), proc_root)
    return cg.container_id is not None or cg.pod_uid is not None


def in_host_pid_namespace(status_text: str | None = None) -> bool:
    """Whether this process sees the host's pids: its `NSpid` (in `/proc/self/status`) has one entry; a process
    in a nested pid namespace (a container without `hostPID` / `--pid=host`) has one per level. NVML reports
    host pids: outside the host's namespace they could name other processes, so kills are refused."""
    if status_text is None:
        try:
            status_text = Path("/proc/self/status").read_text()
        except OSError:
            return False
    for line in status_text.splitlines():
        if line.startswith("NSpid:"):
            return len(line.split()[1:]) == 1
    return True  # a kernel without NSpid (< 4.1) has no nested namespace to report


def parse_passwd(text: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[0] and not line.startswith("#"):
            try:
                out.setdefault(int(parts[2]), parts[0])
            except ValueError:
                continue
    return out


class UserDb:
    """Names uids from one passwd file (re-read when it changes), or from NSS when `path` is None."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._mtime: float | None = None
        self._names: dict[int, str] = {}

    @classmethod
    def for_host(cls, configured: Path | None = None) -> UserDb:
        """The configured file; else the host's file where it is mounted or reachable (`/host/etc/passwd`,
        `/proc/1/root/etc/passwd`); else, outside a container, NSS; else nothing (with a warning): uids stay
        unnamed and destructive actions on their processes are refused."""
        if configured is not None:
            return cls(configured)
        for candidate in HOST_PASSWD_CANDIDATES:
            try:
                candidate.read_bytes()
            except OSError:
                continue
            return cls(candidate)
        if not in_container():
            return cls(None)
        log.warning("running in a container without the host's user database: users show as uids and "
                    "destructive actions on their processes are refused. Run with hostPID (reads "
                    "/proc/1/root/etc/passwd) or mount the host's /etc/passwd at /host/etc/passwd "
                    "(or set agent.attribution.passwd)")
        return cls(Path("/nonexistent/passwd"))

    def name(self, uid: int | None) -> str | None:
        if uid is None:
            return None
        if self.path is None:
            try:
                return pwd.getpwuid(uid).pw_name
            except KeyError:
                return None
        self._refresh()
        return self._names.get(uid)

    def _refresh(self) -> None:
        assert self.path is not None
        try:
            mtime = self.path.stat().st_mtime
            if mtime == self._mtime:
                return
            self._names, self._mtime = parse_passwd(self.path.read_text(errors="replace")), mtime
        except OSError:
            self._names, self._mtime = {}, None
