"""The README's first command: `gpuevents up --demo` shows an action firing within a minute, and Ctrl-C stops it all."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_up_demo_fires_within_a_minute_and_stops_cleanly(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("nats:\n  embedded:\n    port: 0\nengine:\n  dashboard_port: 0\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SLACK_BOT_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "gpuevents.cli", "up", "--demo", "-c", str(cfg)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    lines: list[str] = []
    port = None
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if not ready:
                assert proc.poll() is None, "\n".join(lines)
                continue
            line = proc.stdout.readline().decode(errors="replace")
            if not line:
                break
            lines.append(line.rstrip())
            if m := re.search(r"listens on nats://127\.0\.0\.1:(\d+)", line):
                port = int(m.group(1))
            if "[slack → alice]" in line:
                break
        text = "\n".join(lines)
        assert "simulated" in text.lower(), text  # said plainly: no GPU here
        assert "FIRING demo-idle-gpu-30s on " in text, text
        assert "[slack → alice]" in text, text  # the Slack message, printed without a token
        assert port is not None and _port_open(port)
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=30)[0].decode(errors="replace")
        assert proc.returncode == 0, rest
        assert "embedded NATS stopped" in rest
        assert not _port_open(port)  # no nats-server left behind
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_plain_up_without_rules_says_how_to_give_them_and_serves_the_dashboard(tmp_path: Path) -> None:
    import urllib.request

    cfg = tmp_path / "config.yaml"
    cfg.write_text("nats:\n  embedded:\n    port: 0\n")  # no rules, no dashboard_port: as a bare `up` has
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gpuevents.cli", "up", "-c", str(cfg)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    lines: list[str] = []
    port = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and port is None:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if not ready:
                assert proc.poll() is None, "\n".join(lines)
                continue
            line = proc.stdout.readline().decode(errors="replace")
            if not line:
                break
            lines.append(line.rstrip())
            if m := re.search(r"dashboard on http://127\.0\.0\.1:(\d+)/", line):
                port = int(m.group(1))
        text = "\n".join(lines)
        assert "No rules given, so nothing will fire" in text and "gpuevents up --demo" in text, text
        assert port is not None, text
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:
            assert resp.status == 200
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
