"""A small client of the Prometheus HTTP API (`/api/v1/query_range`), for Prometheus and what speaks its API
(Thanos, Mimir, VictoriaMetrics): auth from the environment, requests paced, errors and timeouts retried."""

from __future__ import annotations

import base64
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

TOKEN_ENV = "GPUEVENTS_PROMETHEUS_TOKEN"
USER_ENV = "GPUEVENTS_PROMETHEUS_USER"
PASSWORD_ENV = "GPUEVENTS_PROMETHEUS_PASSWORD"
RETRIED_STATUS = frozenset({429, *range(500, 600)})  # too many requests, and the server's own troubles


class PromError(RuntimeError):
    """Prometheus said no, or did not answer after every retry; the message says which and what it said."""


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a range query: its labels, and its samples as (epoch seconds, value)."""

    labels: dict[str, str]
    values: list[tuple[float, float]]


def auth_header(environ: Mapping[str, str]) -> str | None:
    """`Authorization` from the environment: a bearer token (GPUEVENTS_PROMETHEUS_TOKEN), else basic auth
    (GPUEVENTS_PROMETHEUS_USER and GPUEVENTS_PROMETHEUS_PASSWORD), else none. Never from the command line, where
    `ps` and shell history would show it."""
    token = environ.get(TOKEN_ENV)
    if token:
        return f"Bearer {token}"
    user = environ.get(USER_ENV)
    if user:
        pair = f"{user}:{environ.get(PASSWORD_ENV, '')}".encode()
        return f"Basic {base64.b64encode(pair).decode()}"
    return None


def parse_matrix(body: Any) -> list[Series]:
    """The series of a `query_range` answer (`resultType: matrix`); PromError for anything else."""
    if not isinstance(body, dict) or body.get("status") != "success":
        what = body.get("error", body) if isinstance(body, dict) else body
        raise PromError(f"Prometheus answered an error: {what}")
    data = body.get("data") or {}
    if data.get("resultType") != "matrix":
        raise PromError(f"expected a matrix from query_range, got {data.get('resultType')!r}")
    out = []
    for r in data.get("result") or []:
        values = [(float(t), float(v)) for t, v in r.get("values") or []]
        out.append(Series(labels={str(k): str(v) for k, v in (r.get("metric") or {}).items()}, values=values))
    return out


@dataclass
class PromClient:
    """Range queries against `url`; at least `pace_s` between two requests (be kind to a busy server); each one
    retried `retries` times on a timeout, a connection error or a 5xx/429, waiting longer each time."""

    url: str
    authorization: str | None = None
    timeout_s: float = 60.0
    retries: int = 5
    backoff_s: float = 1.0
    pace_s: float = 0.2
    sleep: Callable[[float], None] = time.sleep
    monotonic: Callable[[], float] = time.monotonic
    retried: int = 0
    """How many requests were tried again, for the import's last words."""
    _last: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise PromError(f"{self.url!r} is not a URL; write it like http://prometheus:9090")

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[Series]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}",
                  "timeout": f"{self.timeout_s:g}s"}
        return parse_matrix(self._get("/api/v1/query_range", params))

    def labels_at(self, expr: str, at: float) -> list[dict[str, str]]:
        """The label sets of an instant query's series at `at` (their values left aside)."""
        body = self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}", "timeout": f"{self.timeout_s:g}s"})
        if not isinstance(body, dict) or body.get("status") != "success":
            raise PromError(f"Prometheus answered an error: {body.get('error') if isinstance(body, dict) else body}")
        return [{str(k): str(v) for k, v in (r.get("metric") or {}).items()}
                for r in (body.get("data") or {}).get("result") or []]

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        url = f"{self.url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        if self.authorization:
            request.add_header("Authorization", self.authorization)
        wait = self.backoff_s
        for attempt in range(self.retries + 1):
            self._pace()
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as e:
                if e.code not in RETRIED_STATUS or attempt == self.retries:
                    raise PromError(f"{self.url}: HTTP {e.code} for {params.get('query', path)!r}: "
                                    f"{_said(e)}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as e:
                if attempt == self.retries:
                    raise PromError(f"{self.url}: no answer after {self.retries + 1} tries "
                                    f"({getattr(e, 'reason', e)}); check --url and that it is up") from None
            except json.JSONDecodeError:
                raise PromError(f"{self.url}: the answer is not JSON: is this the Prometheus HTTP API?") from None
            self.retried += 1
            self.sleep(wait)
            wait = min(wait * 2, 30.0)
        raise AssertionError("unreachable")

    def _pace(self) -> None:
        now = self.monotonic()
        if self._last is not None and now - self._last < self.pace_s:
            self.sleep(self.pace_s - (now - self._last))
        self._last = self.monotonic()


def _said(e: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(e.read())
        return str(body.get("error") or body)[:300]
    except (ValueError, OSError, AttributeError):
        return e.reason if isinstance(e.reason, str) else "no details"
