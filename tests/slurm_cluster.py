"""A real Slurm on loopback for tests: munged, slurmctld and slurmd from Debian's packages, fake GPUs.

Everything lives in a temporary directory (shared/notes/slurm-on-one-machine.md has the facts this is built
on). `SlurmCluster.start()` returns once the node is idle; `stop()` cancels every job and ends the daemons.
Tests that need it use the `slurm` fixture, which skips (saying why) only where Slurm cannot be installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd", "scontrol", "sbatch", "squeue", "scancel")
COMMAND_TIMEOUT_S = 15.0
GPUS = 2
DEPLOY_SLURM = Path(__file__).resolve().parents[1] / "deploy" / "slurm"


def missing_binaries() -> list[str]:
    return [b for b in DAEMONS if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class SlurmCluster:
    """One slurmctld and one slurmd (node `node`) with GPUS fake GPUs, partitions `debug` and `protected`;
    slurmd runs deploy/slurm's prolog and epilog, which keep `job_map_dir`."""

    root: Path
    node: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    extra_conf: list[str] = field(default_factory=list)  # more slurm.conf lines (Prolog=..., Epilog=...)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def job_map_dir(self) -> Path:
        """The HPC job mapping directory that slurmd's prolog and epilog (deploy/slurm) keep."""
        return self.root / "job-map"

    @property
    def gpu_devices(self) -> list[Path]:
        return [self.root / "dev" / f"nvidia{i}" for i in range(GPUS)]

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        for d in ("state", "spool", "log", "run", "dev", "munge"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        for i, dev in enumerate(self.gpu_devices):
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(195, i))  # character devices, as GRES requires
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        sock = self.root / "munge" / "munge.socket"
        self._spawn([_binary("munged"), "-F", "-f", f"--key-file={key}", f"--socket={sock}",
                     f"--pid-file={self.root / 'run' / 'munged.pid'}", f"--log-file={self.root / 'log' / 'munged.log'}",
                     f"--seed-file={self.root / 'munge' / 'seed'}"], "munged")
        self._wait(lambda: sock.exists(), timeout, "munged's socket")
        self._write_hooks()
        self._write_conf(sock)
        self._spawn([_binary("slurmctld"), "-D", "-c", "-f", str(self.conf)], "slurmctld")
        self._spawn([_binary("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)], "slurmd")
        self._wait(lambda: self.node_state() in ("idle", "mixed", "allocated"), timeout, "the node to be idle")
        return self

    def _write_hooks(self) -> None:
        """Wrappers that run deploy/slurm's prolog and epilog on this cluster's mapping directory (slurmd gives
        a prolog its own environment, not slurmd's)."""
        for name in ("prolog", "epilog"):
            wrapper = self.root / f"{name}.sh"
            wrapper.write_text(f"#!/bin/sh\nGPUEVENTS_JOB_MAP_DIR={self.job_map_dir} exec /bin/sh "
                               f"{DEPLOY_SLURM / (name + '.sh')}\n")
            wrapper.chmod(0o755)

    def _write_conf(self, munge_socket: Path) -> None:
        r = self.root
        devices = ",".join(str(d) for d in self.gpu_devices)
        (r / "gres.conf").write_text(f"AutoDetect=off\nNodeName={self.node} Name=gpu File={devices}\n")
        self.conf.write_text("\n".join([
            "ClusterName=gpuevents-test",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"AuthInfo=socket={munge_socket},cred_expire=10",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "GresTypes=gpu",
            "MailProg=/bin/true",
            "SlurmdParameters=config_overrides",
            "SchedulerParameters=batch_sched_delay=0,sched_interval=1",
            "ReturnToService=2",
            "MpiDefault=none",
            f"Prolog={r / 'prolog.sh'}",
            f"Epilog={r / 'epilog.sh'}",
            f"NodeName={self.node} NodeAddr=127.0.0.1 NodeHostname={self.node} CPUs=8 RealMemory=4000 "
            f"Gres=gpu:{GPUS} State=UNKNOWN",
            f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
            f"PartitionName=protected Nodes={self.node} MaxTime=INFINITE State=UP",
            *self.extra_conf,
            "",
        ]))

    def _spawn(self, argv: list[str], name: str) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True))

    def _wait(self, cond: Callable[[], object], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    daemon = p.args[0] if isinstance(p.args, list) else p.args
                    raise RuntimeError(f"{daemon!s} exited with {p.returncode} while waiting for {what}:\n"
                                       + self.logs())
            if cond():
                return
            time.sleep(0.1)
        raise TimeoutError(f"Slurm: timed out waiting for {what}:\n{self.logs()}")

    def logs(self) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            with contextlib.suppress(OSError):
                out.append(f"--- {f.name}\n" + f.read_text(errors="replace")[-3000:])
        return "\n".join(out)

    def run(self, *argv: str, check: bool = True, timeout: float = COMMAND_TIMEOUT_S) -> str:
        """A Slurm client command (`scontrol`, `squeue`, ...) against this cluster; its stdout."""
        done = subprocess.run([_binary(argv[0]), *argv[1:]], capture_output=True, text=True, env=self.env,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def node_state(self) -> str:
        try:
            return self.run("sinfo", "-h", "-n", self.node, "-o", "%T", check=False, timeout=5).strip()
        except subprocess.TimeoutExpired:
            return ""

    def sbatch(self, script: str, *options: str) -> str:
        """Submit a batch script (its text, `#!/bin/sh` added); the job id."""
        out = self.run("sbatch", "--parsable", f"--chdir={self.root}", f"--output={self.root / 'log'}/job-%j.out",
                       *options, "--wrap", script)
        return out.strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        """The job's state in squeue (RUNNING, PENDING, ...), or "" once it has left the queue."""
        return self.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).strip()

    def job_pids(self, job_id: str) -> list[int]:
        """The pids of the job's processes (`scontrol listpids`), its steps' and its batch script's."""
        out = self.run("scontrol", "listpids", job_id, check=False)
        pids = []
        for line in out.splitlines()[1:]:
            parts = line.split()
            if parts and parts[0].isdigit():
                pids.append(int(parts[0]))
        return pids

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", "-u", "root", check=False, timeout=5)
        with contextlib.suppress(Exception):
            self.run("scontrol", "shutdown", check=False, timeout=5)
        for p in reversed(self.procs):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        # job steps started by slurmd run in sessions of their own
        subprocess.run(["pkill", "-f", f"slurmstepd.*{self.root}"], check=False, capture_output=True)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A running Slurm cluster shared by the session's tests (each test cancels its own jobs)."""
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed here (missing {', '.join(missing)}); .ci/run installs "
                    "slurmctld, slurmd, slurm-client and munge from Debian's packages")
    if os.geteuid() != 0:
        pytest.skip("the Slurm fixture makes fake GPU character devices (mknod) and runs slurmd: it needs root")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except Exception:
        cluster.stop()
        raise
    try:
        yield cluster
    finally:
        cluster.stop()
