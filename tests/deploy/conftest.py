"""Fixtures for the deployment tests: the deploy/ scripts as modules, and a nats-server with gpuevents users."""

from __future__ import annotations

import importlib.util
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from gpuevents.server import find_binary, free_port

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CLUSTER = "c1"
NODES = ("n1", "n2", "gpu-7.example.com")


def load_script(path: Path) -> ModuleType:
    """Import a script under deploy/ (not a package) as a module."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def nats_auth() -> ModuleType:
    return load_script(DEPLOY / "nats" / "nats_auth.py")


@dataclass(frozen=True)
class AuthServer:
    url: str
    cluster: str
    engine_user: str
    engine_password: str
    agent_passwords: dict[str, str]
    log: Path
    role_users: dict[str, str]
    role_passwords: dict[str, str]

    def agent(self, node: str) -> tuple[str, str]:
        """(user, password) of `node`'s agent."""
        return f"agent/{self.cluster}/{node}", self.agent_passwords[node]

    def role(self, role: str) -> tuple[str, str]:
        """(user, password) of a role: engine, runner, operator, admin."""
        return self.role_users[role], self.role_passwords[role]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.settimeout(0.5)
            return s.recv(4).startswith(b"INFO")
    except OSError:
        return False


@pytest.fixture
def nats_auth_server(tmp_path: Path, nats_auth: ModuleType) -> Iterator[AuthServer]:
    """nats-server with JetStream and the generated users, laid out as the Helm chart lays it out.

    The chart renders its config into /etc/nats-config/nats.conf and deploy/nats/values.yaml
    mounts the auth Secret at /etc/nats-auth and includes it with a path relative to the config;
    the same include string is used here, so a wrong path in values.yaml fails this fixture.
    """
    generated = nats_auth.generate(CLUSTER, NODES, tmp_path / "out")
    values = yaml.safe_load((DEPLOY / "nats" / "values.yaml").read_text())
    include = values["config"]["merge"]["$include"]
    mount = next(p["value"]["mountPath"] for p in values["container"]["patch"]
                 if p["path"] == "/volumeMounts/-" and p["value"]["name"] == "gpuevents-auth")
    etc = tmp_path / "etc"
    config_dir = etc / "nats-config"
    auth_dir = etc / mount.removeprefix("/etc/")
    config_dir.mkdir(parents=True)
    auth_dir.mkdir(parents=True)
    (auth_dir / "auth.conf").write_text(generated.auth_conf.read_text())
    port = free_port()
    conf = config_dir / "nats.conf"
    conf.write_text(
        f'host: "127.0.0.1"\nport: {port}\nserver_name: "deploy-test"\n'
        f'jetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
        f'include "{include}"\n'
    )
    log = tmp_path / "nats.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(find_binary()), "-c", str(conf)], stdout=out, stderr=out,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not _answers(port):
            if proc.poll() is not None:
                raise AssertionError(f"nats-server exited at start:\n{log.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"nats-server did not answer within 10s:\n{log.read_text()}")
            time.sleep(0.02)
        yield AuthServer(
            url=f"nats://127.0.0.1:{port}",
            cluster=CLUSTER,
            engine_user=nats_auth.ENGINE_USER,
            engine_password=generated.engine_password,
            agent_passwords=generated.agent_passwords,
            log=log,
            role_users=dict(nats_auth.ROLE_USERS),
            role_passwords=generated.role_passwords,
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
