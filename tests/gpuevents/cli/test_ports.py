"""Two engines or agents on one host: a configured port already taken is one line naming the option to change,
exit 1, never a traceback (real `gpuevents` processes against a real nats-server)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuevents.server import EmbeddedServer
from tests.gpuevents.cli.test_stopping import _env

GPUEVENTS = [sys.executable, "-m", "gpuevents.cli"]


@pytest.fixture
def taken() -> Iterator[int]:
    """A port some other process listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _config(tmp_path: Path, url: str, engine: str, agent: str) -> Path:
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "r.yaml").write_text(
        "rules:\n  - name: r\n    entity: gpu\n    when: gpu.idle\n    actions: [{type: log, message: idle}]\n")
    path = tmp_path / "config.yaml"
    path.write_text(f"nats: {{url: '{url}'}}\n"
                    f"engine: {{rules: ['{rules}'], usage_db: '{tmp_path / 'usage.sqlite'}', {engine}}}\n"
                    f"agent: {{metrics_address: 127.0.0.1, {agent}}}\n")
    return path


@pytest.mark.parametrize(("verb", "engine", "agent", "option"), [
    (["engine"], "metrics_address: 127.0.0.1, metrics_port: {port}", "metrics_port: null", "engine.metrics_port"),
    (["engine"], "metrics_port: null, dashboard_port: {port}", "metrics_port: null", "engine.dashboard_port"),
    (["agent", "--simulate"], "metrics_port: null", "metrics_port: {port}", "agent.metrics_port"),
])
def test_a_port_in_use_is_one_line_naming_the_option(tmp_path: Path, nats_server: EmbeddedServer, taken: int,
                                                     verb: list[str], engine: str, agent: str, option: str) -> None:
    cfg = _config(tmp_path, nats_server.url, engine.format(port=taken), agent.format(port=taken))
    done = subprocess.run([*GPUEVENTS, *verb, "-c", str(cfg)], env=_env(tmp_path), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {option}: 127.0.0.1:{taken} is in use (another gpuevents on this host?); set "
                      f"{option} (GPUEVENTS_{option.upper().replace('.', '__')}) to a free port, or null to turn "
                      "it off"], done.stderr
