"""A stand-in in front of a real HTTP server that fails on purpose: it answers 503, or holds a request past the
client's timeout, on the requests a plan names, and passes the others through."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Plan = Callable[[int], str]
"""The n-th request (from 1) → "pass", "503", or "hang"."""


@contextmanager
def flaky(upstream: str, plan: Plan, hang_s: float = 3.0) -> Iterator[tuple[str, list[str]]]:
    """(the stand-in's URL, what it did to each request so far)."""
    seen: list[str] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with lock:
                what = plan(len(seen) + 1)
                seen.append(what)
            if what == "503":
                self._answer(503, b'{"status":"error","errorType":"unavailable","error":"overloaded"}')
                return
            if what == "hang":
                time.sleep(hang_s)
            try:
                with urllib.request.urlopen(upstream + self.path, timeout=30) as r:
                    self._answer(r.status, r.read())
            except urllib.error.HTTPError as e:
                self._answer(e.code, e.read())

        def _answer(self, status: int, body: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting (a "hang"): what it was meant to do

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
