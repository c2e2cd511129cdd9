"""Who holds a GPU: psutil identity (cached per pid and create time), pod and owner, and live process control."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import psutil

from agent.cgroups import read_cgroup
from agent.host import UserDb
from agent.kubelet import PodMeta
from agent.sample import AccessDenied, LiveProcess, ProcessIdentity
from gpuevents.config import AttributionConfig

log = logging.getLogger(__name__)

SIGNALS: dict[str, signal.Signals] = {
    "TERM": signal.SIGTERM, "INT": signal.SIGINT, "HUP": signal.SIGHUP, "QUIT": signal.SIGQUIT,
    "KILL": signal.SIGKILL, "USR1": signal.SIGUSR1, "USR2": signal.SIGUSR2,
}


def _ts(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"


def resolve_owner(
    user: str | None,
    pod: PodMeta | None,
    owners: Mapping[str, str],
    attribution: AttributionConfig,
) -> str | None:
    """Config `owners[user]`, else the pod's owner label or annotation, else `<user>@<default_domain>`."""
    if user and user in owners:
        return owners[user]
    if pod is not None:
        if attribution.owner_pod_label and pod.labels.get(attribution.owner_pod_label):
            return pod.labels[attribution.owner_pod_label]
        if attribution.owner_pod_annotation and pod.annotations.get(attribution.owner_pod_annotation):
            return pod.annotations[attribution.owner_pod_annotation]
    if user and attribution.default_domain:
        return f"{user}@{attribution.default_domain}"
    return None


class Attributor:
    """Completes identities with the pod (from the kubelet), its labels and the owner; cached per process.

    With `attribution.team_pod_label`, that pod label's value is also put under `team_label`
    (config `costs.team_label`), the label usage reports group by.
    """

    def __init__(
        self,
        attribution: AttributionConfig,
        owners: Mapping[str, str],
        pods: Callable[[str], PodMeta | None] | None = None,
        team_label: str = "team",
    ) -> None:
        self.attribution = attribution
        self.team_label = team_label
        self.owners = dict(owners)
        self.pods = pods
        self._cache: dict[tuple[int, datetime], ProcessIdentity] = {}

    def complete(self, identities: Mapping[int, ProcessIdentity]) -> dict[int, ProcessIdentity]:
        out: dict[int, ProcessIdentity] = {}
        live: set[tuple[int, datetime]] = set()
        for pid, ident in identities.items():
            key = (pid, ident.create_time)
            live.add(key)
            done = self._cache.get(key)
            if done is None or (done.pod is None and ident.pod_uid and self._pod(ident.pod_uid)):
                done = self._complete(ident)
                self._cache[key] = done
            elif done.ppid != ident.ppid:  # the parent is read live: an orphan is re-parented
                done = self._cache[key] = replace(done, ppid=ident.ppid)
            out[pid] = done
        for key in [k for k in self._cache if k not in live]:
            del self._cache[key]
        return out

    def _pod(self, uid: str) -> PodMeta | None:
        return self.pods(uid) if self.pods is not None else None

    def _complete(self, ident: ProcessIdentity) -> ProcessIdentity:
        pod = self._pod(ident.pod_uid) if ident.pod_uid else None
        owner = ident.owner or resolve_owner(ident.user, pod, self.owners, self.attribution)
        if pod is None:
            return replace(ident, owner=owner)
        labels = dict(pod.labels)
        team_key = self.attribution.team_pod_label
        if team_key and pod.labels.get(team_key):
            # reports group by `costs.team_label` in process labels; the pod may name it otherwise
            labels[self.team_label] = pod.labels[team_key]
        container = pod.containers.get(ident.container_id) if ident.container_id else None
        return replace(ident, pod=f"{pod.namespace}/{pod.name}", labels=labels, owner=owner,
                       container=container or ident.container)


class PsutilIdentifier:
    """Reads user, name, command line, create time and cgroup of the pids NVML reports, once each."""

    def __init__(self, cmdline_max: int = 1024, proc_root: Path = Path("/proc"), users: UserDb | None = None) -> None:
        self.cmdline_max = cmdline_max
        self.proc_root = proc_root
        self.users = users if users is not None else UserDb.for_host()
        self._cache: dict[int, tuple[psutil.Process, ProcessIdentity]] = {}

    def identify(self, pids: Iterable[int]) -> dict[int, ProcessIdentity]:
        out: dict[int, ProcessIdentity] = {}
        wanted = set(pids)
        for pid in wanted:
            cached = self._cache.get(pid)
            if cached is not None and cached[0].is_running():
                out[pid] = self._live(pid, *cached)
                continue
            got = self._read(pid)
            if got is None:
                self._cache.pop(pid, None)
                continue
            self._cache[pid] = got
            out[pid] = got[1]
        for pid in [p for p in self._cache if p not in wanted]:
            del self._cache[pid]
        return out

    def _live(self, pid: int, proc: psutil.Process, ident: ProcessIdentity) -> ProcessIdentity:
        """The cached identity with what can change while a process lives: its parent (a process whose parent
        exits is re-parented to pid 1 or a subreaper: how a ghost is seen)."""
        try:
            ppid = proc.ppid()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return ident
        if ppid != ident.ppid:
            ident = replace(ident, ppid=ppid)
            self._cache[pid] = (proc, ident)
        return ident

    def _read(self, pid: int) -> tuple[psutil.Process, ProcessIdentity] | None:
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                create_time = proc.create_time()
                name = proc.name()
                exe = program_of(proc)
                uid: int | None = proc.uids().real
                ppid: int | None = proc.ppid()
                try:
                    cmdline = " ".join(proc.cmdline())
                except psutil.AccessDenied:
                    cmdline = ""
        except psutil.NoSuchProcess:
            return None
        except psutil.AccessDenied as e:
            log.debug("cannot read process %d: %s", pid, e)
            return None
        cg = read_cgroup(pid, self.proc_root)
        job = cg.job or _slurm_job_from_environment(proc)
        ident = ProcessIdentity(
            pid=pid, create_time=_ts(create_time), name=name, exe=exe,
            cmdline=truncate(cmdline, self.cmdline_max), user=self.users.name(uid), uid=uid, ppid=ppid,
            container_id=cg.container_id, pod_uid=cg.pod_uid, service=cg.service, job=job,
        )
        return proc, ident


def program_of(proc: psutil.Process) -> str:
    """The process's executable (`/proc/<pid>/exe`), the program it runs whatever name it gives itself; empty
    when it cannot be read (a kernel thread, no permission)."""
    try:
        return str(proc.exe())
    except (psutil.Error, OSError):
        return ""


def _slurm_job_from_environment(proc: psutil.Process) -> str | None:
    """`SLURM_JOB_ID` from the process's environment: where Slurm tracks processes without cgroups
    (proctrack/linuxproc). Read once per process; None when it cannot be read."""
    try:
        job = proc.environ().get("SLURM_JOB_ID")
    except (psutil.Error, OSError):
        return None
    return job if job and job.isdigit() else None


def _same(proc: psutil.Process, create_time: datetime, tolerance_s: float) -> bool:
    return bool(abs(proc.create_time() - create_time.timestamp()) <= tolerance_s)


class PsutilControl:
    """Real processes: look up, signal only if the create time still matches, and watch for the end."""

    def __init__(self, tolerance_s: float = 1.0, users: UserDb | None = None) -> None:
        self.tolerance_s = tolerance_s
        self.users = users if users is not None else UserDb.for_host()

    def lookup(self, pid: int) -> LiveProcess | None:
        try:
            p = psutil.Process(pid)
            with p.oneshot():
                if p.status() == psutil.STATUS_ZOMBIE:
                    return None
                user = self.users.name(p.uids().real)
                return LiveProcess(pid=pid, create_time=_ts(p.create_time()), user=user, name=p.name(),
                                   exe=program_of(p))
        except psutil.NoSuchProcess:  # ZombieProcess is one too
            return None
        except psutil.AccessDenied as e:  # alive, but not ours to read: never report it as gone
            raise AccessDenied(str(e)) from None

    def send(self, pid: int, create_time: datetime, signal_name: str) -> bool:
        try:
            p = psutil.Process(pid)
            if not _same(p, create_time, self.tolerance_s) or p.status() == psutil.STATUS_ZOMBIE:
                return False
            # psutil checks again that the pid was not reused since Process() before signalling.
            p.send_signal(SIGNALS[signal_name])
            return True
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied as e:
            raise AccessDenied(str(e)) from None

    def alive(self, pid: int, create_time: datetime) -> bool:
        try:
            p = psutil.Process(pid)
            return _same(p, create_time, self.tolerance_s) and bool(p.status() != psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return False


def own_pid() -> int:
    return os.getpid()
