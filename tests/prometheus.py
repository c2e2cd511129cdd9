"""A real Prometheus on loopback for tests: `/usr/bin/prometheus` (Debian's package; .ci/run installs it) scraping
the given targets every second, with a temporary config and store; queries through its HTTP API.

Tests that need it use `PrometheusServer.start()` as a context manager, which skips (saying why) only where
the binary is not installed.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

BINARY = shutil.which("prometheus") or "/usr/bin/prometheus"
START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    """One Prometheus process; `jobs` maps a job name to its `host:port` targets."""

    def __init__(self, directory: Path, jobs: dict[str, list[str]], scrape_interval: str = "1s",
                 extra_args: tuple[str, ...] = ()) -> None:
        self.directory = directory
        self.jobs = jobs
        self.extra_args = extra_args
        self.scrape_interval = scrape_interval
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    @contextmanager
    def running(cls, directory: Path, jobs: dict[str, list[str]]) -> Iterator[PrometheusServer]:
        if not Path(BINARY).exists():
            pytest.skip("prometheus is not installed (apt-get install prometheus; .ci/run does it)")
        server = cls(directory, jobs)
        server.start()
        try:
            yield server
        finally:
            server.stop()

    @classmethod
    @contextmanager
    def backfilled(cls, directory: Path, openmetrics: Path) -> Iterator[PrometheusServer]:
        """A Prometheus that scrapes nothing and holds the samples of `openmetrics` (OpenMetrics text with
        timestamps), written into its store by `promtool tsdb create-blocks-from openmetrics` before it starts."""
        promtool = shutil.which("promtool") or "/usr/bin/promtool"
        if not Path(BINARY).exists() or not Path(promtool).exists():
            pytest.skip("prometheus is not installed (apt-get install prometheus; .ci/run does it)")
        done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=24h",
                               str(openmetrics), str(directory / "data")], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        server = cls(directory, {}, extra_args=("--storage.tsdb.retention.time=100y",))
        server.start()
        try:
            yield server
        finally:
            server.stop()

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": self.scrape_interval, "scrape_timeout": self.scrape_interval,
                       "evaluation_interval": self.scrape_interval},
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}
                               for job, targets in self.jobs.items()],
        }
        cfg = self.directory / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config))
        log = (self.directory / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [BINARY, f"--config.file={cfg}", f"--storage.tsdb.path={self.directory / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn", *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}: {self.log()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus not ready after {START_TIMEOUT_S}s: {self.log()[-2000:]}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def log(self) -> str:
        return (self.directory / "prometheus.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    # ------------------------------------------------------------ the HTTP API
    def api(self, path: str, **params: str | list[str]) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result: a list of {"metric": labels, "value": [t, "v"]} (scalars as one item)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def wait_until(self, condition: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            last = condition()
            if last:
                return last
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}; last {last!r}\n"
                                     f"{self.log()[-2000:]}")
            time.sleep(0.2)

    def wait_for_series(self, expr: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        return list(self.wait_until(lambda: self.query(expr), f"series of {expr}", timeout))

    def scrapes(self, job: str) -> int:
        """How many samples of `up` the job has stored so far (one per scrape)."""
        found = self.query(f'count_over_time(up{{job="{job}"}}[10m])')
        return min((int(float(r["value"][1])) for r in found), default=0)
