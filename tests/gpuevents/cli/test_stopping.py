"""Real `gpuevents` processes where NATS is out of reach: the long-running ones stop on SIGTERM and SIGINT within
10 s and say what is wrong; every client command says so, with the address, after 3 s (CLIENT_CONNECT_S) and exits 2."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuevents.bus import CLIENT_CONNECT_S
from gpuevents.config import EmbeddedServerConfig
from gpuevents.server import EmbeddedServer, free_port

pytestmark = pytest.mark.slow  # every test runs real `gpuevents` processes that wait out timeouts

REPO = Path(__file__).resolve().parents[3]
GPUEVENTS = [sys.executable, "-m", "gpuevents.cli"]
STOP_WITHIN_S = 10.0


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUEVENTS_", "NATS_"))}
    return {**env, "HOME": str(tmp_path), **extra}


def _config(tmp_path: Path, url: str | None) -> Path:
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "r.yaml").write_text(
        "rules:\n  - name: r\n    entity: gpu\n    when: gpu.idle\n    actions: [{type: log, message: idle}]\n")
    nats = f"nats: {{url: '{url}', connect_timeout: 2s, reconnect_wait: 0.5s}}\n" if url else ""
    path = tmp_path / "config.yaml"
    path.write_text(nats + f"engine: {{rules: ['{rules}'], usage_db: '{tmp_path / 'usage.sqlite'}', "
                    "metrics_port: null}\nagent: {metrics_port: null}\n")
    return path


class Proc:
    """A child process whose output is read as it comes, without blocking."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
        assert self.p.stdout is not None
        os.set_blocking(self.p.stdout.fileno(), False)
        self.out = b""

    def _read(self, timeout: float) -> None:
        assert self.p.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.p.stdout, selectors.EVENT_READ)
            if sel.select(timeout):
                self.out += self.p.stdout.read() or b""

    def wait_output(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text.encode() not in self.out:
            if time.monotonic() > deadline or self.p.poll() is not None:
                self._read(0.1)
                assert text.encode() in self.out, f"{text!r} not in the output:\n{self.out.decode()[-3000:]}"
                return
            self._read(0.2)

    def stop(self, sig: signal.Signals) -> float:
        """Send `sig`; seconds until the process ended (it is killed, and the test fails, after STOP_WITHIN_S)."""
        start = time.monotonic()
        self.p.send_signal(sig)
        try:
            self.p.wait(STOP_WITHIN_S + 5)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(5)
            raise AssertionError(f"still running {STOP_WITHIN_S + 5:g}s after {sig.name}:\n"
                                 f"{self.out.decode()[-3000:]}") from None
        self._read(0.1)
        return time.monotonic() - start


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_runner_without_nats_url_says_so_and_stops_on_a_signal(tmp_path: Path, sig: signal.Signals) -> None:
    """`gpuevents runner -c config.example.yaml`: no nats.url; it said nothing and ignored signals for minutes."""
    port = free_port()  # where the embedded server would listen: nothing does
    proc = Proc([*GPUEVENTS, "runner", "-c", str(REPO / "config.example.yaml")],
                _env(tmp_path, GPUEVENTS_NATS__EMBEDDED__PORT=str(port)), tmp_path)
    proc.wait_output("nats.url is not set", 30)
    proc.wait_output(f"cannot reach NATS at nats://127.0.0.1:{port}", 30)
    assert proc.stop(sig) < STOP_WITHIN_S


@pytest.mark.parametrize("verb", [["engine"], ["runner"], ["agent", "--simulate"], ["up"]])
def test_every_process_stops_on_sigterm_while_nats_is_out_of_reach(tmp_path: Path, verb: list[str]) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    proc = Proc([*GPUEVENTS, *verb, "-c", str(_config(tmp_path, url))], _env(tmp_path), tmp_path)
    proc.wait_output(f"cannot reach NATS at {url}", 30)
    assert proc.stop(signal.SIGTERM) < STOP_WITHIN_S
    assert "Traceback" not in proc.out.decode()


CLIENT_COMMANDS = [
    ["status"], ["audit"], ["snooze", "r", "n1/gpu0", "--for", "1h"], ["keep", "r", "n1/gpu0", "1h", "--reason", "x"],
    ["free"],
    ["kill", "n1", "4242"], ["cancel", "123"], ["rules", "backtest", "rules", "--since", "1h"],
]


@pytest.mark.parametrize("command", CLIENT_COMMANDS, ids=lambda c: "-".join(c[:2]))
def test_a_client_command_that_cannot_reach_nats_says_so_with_the_address_and_exits_2(
    tmp_path: Path, command: list[str]
) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    start = time.monotonic()
    done = subprocess.run([*GPUEVENTS, *command, "-c", str(_config(tmp_path, url))], env=_env(tmp_path),
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    assert done.returncode == 2, done.stdout + done.stderr
    # the command gives NATS CLIENT_CONNECT_S (3 s) and says so; before, `status` sat silent for 90 s
    assert f"cannot reach NATS at {url} within {CLIENT_CONNECT_S:g}s" in done.stderr
    assert "Traceback" not in done.stderr
    # the whole process, interpreter start included (seconds on a loaded machine): far from a hang
    assert took < 30, f"took {took:.1f}s"


def test_an_acting_engine_whose_nats_went_away_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    """Before: releasing the lease timed out, the engine 'stopped unexpectedly' (exit 1) with two tracebacks."""
    server = EmbeddedServer(EmbeddedServerConfig(host="127.0.0.1", port=0, data_dir=tmp_path / "nats"),
                            log_file=tmp_path / "nats.log")
    server.start()
    try:
        proc = Proc([*GPUEVENTS, "engine", "-c", str(_config(tmp_path, server.url))], _env(tmp_path), tmp_path)
        proc.wait_output("this engine is acting", 60)
    finally:
        server.stop()
    proc.wait_output("disconnected from NATS", 30)
    assert proc.stop(signal.SIGTERM) < STOP_WITHIN_S
    assert proc.p.returncode == 0, proc.out.decode()[-3000:]
    assert "Traceback" not in proc.out.decode()
