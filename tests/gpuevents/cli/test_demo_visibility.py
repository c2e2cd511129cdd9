"""A newcomer's first minute: `gpuevents up --demo`, then `report` shows GPU-hours already and `free` offers the
demo's idle GPUs that nobody holds (never GPU 0, held idle by alice's notebook, nor 1, training, nor 2, the
ghost), as the dashboard's GET /api/free does."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytestmark = pytest.mark.slow  # runs `gpuevents up --demo` as a process

T = TypeVar("T")
PINNED = {0, 1, 2}  # agent/scenarios/demo.yaml: held idle, training, a ghost holding memory


def _gpuevents(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuevents.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def _until(check: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}; last {last!r}")


def test_after_a_minute_of_the_demo_report_has_gpu_hours_and_free_offers_idle_unheld_gpus(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("nats:\n  embedded:\n    port: 0\nengine:\n  dashboard_port: 0\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SLACK_BOT_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "gpuevents.cli", "up", "--demo", "-c", str(cfg)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    stdout = proc.stdout
    assert stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(iter(stdout.readline, "")), daemon=True)
    reader.start()
    try:
        def ports() -> tuple[int, int] | None:
            text = "".join(lines)
            nats = re.search(r"listens on nats://127\.0\.0\.1:(\d+)", text)
            web = re.search(r"dashboard on http://127\.0\.0\.1:(\d+)/", text)
            return (int(nats.group(1)), int(web.group(1))) if nats and web else None

        nats_port, web_port = _until(ports, 60, "NATS and the dashboard")
        banner = "".join(lines)
        assert "gpuevents free" in banner and "gpuevents simulate --history" in banner
        client = tmp_path / "client.yaml"
        client.write_text(f"nats:\n  url: nats://127.0.0.1:{nats_port}\n")

        def report() -> dict[str, Any] | None:
            r = _gpuevents(tmp_path, "report", "--format", "json", "-c", str(cfg))
            data = json.loads(r.stdout) if r.returncode == 0 else None
            return data if data and data["fleet"]["gpu_h"] > 0 else None

        data = _until(report, 60, "GPU-hours in the report")
        assert data["fleet"]["gpus"] == 8
        assert data["heatmap"]["rows"][0]["cells"][-1] is not None  # the current hour

        def ghost_arrived() -> bool:  # 20 s into the demo a ghost takes GPU 2's memory and never lets go
            r = _gpuevents(tmp_path, "status", "--all", "--json", "-c", str(client))
            lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
            return any(g["index"] == 2 and g["processes"] for x in lines if "node" in x for g in x["node"]["gpus"])

        _until(ghost_arrived, 90, "the demo's ghost on GPU 2")

        def free() -> dict[str, Any] | None:
            r = _gpuevents(tmp_path, "free", "--json", "-c", str(client))
            answer = json.loads(r.stdout) if r.stdout.startswith("{") else None
            return answer if answer and answer["nodes"] else None

        answer = _until(free, 90, "a free GPU in the demo")
        offered = [g for n in answer["nodes"] for g in n["gpus"]]
        assert offered and not PINNED & {g["index"] for g in offered}, offered
        idle_for = [g["idle_for_s"] or 0 for g in offered]
        assert idle_for == sorted(idle_for, reverse=True)  # most idle first
        line = answer["nodes"][0]["env"]
        assert line == "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=" + ",".join(str(g["index"]) for g in offered)

        with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/api/free", timeout=10) as r:
            api = json.loads(r.read())
        assert not PINNED & {g["index"] for n in api["nodes"] for g in n["gpus"]}
        assert api["excluded"].get("held", 0) >= 2  # alice's notebook and the ghost at least
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
