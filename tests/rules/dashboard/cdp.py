"""A headless Chromium driven over the DevTools protocol with aiohttp websockets; for dashboard tests."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--remote-debugging-port=0", "--window-size=1280,800",
)


def chromium_binary() -> str:
    for name in CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError("no chromium on PATH; install Debian's `chromium` package (apt-get install -y chromium)")


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


class Chromium:
    """One browser process with one page, started on `url`; always `close()` it."""

    def __init__(self, profile: Path) -> None:
        self.profile = profile
        self.proc: asyncio.subprocess.Process | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)

    async def start(self, url: str, timeout: float = 30.0) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", url,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # its helper processes share the group, so close() ends them all
        )
        deadline = time.monotonic() + timeout
        port_file = self.profile / "DevToolsActivePort"
        port = None
        while port is None:
            if self.proc.returncode is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode} before DevTools came up")
            if port_file.exists():
                first = port_file.read_text().splitlines()[:1]
                if first and first[0].isdigit():
                    port = int(first[0])
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not open its DevTools port")
            await asyncio.sleep(0.05)
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        ws_url = None
        while ws_url is None:
            try:
                async with self._http.get(f"http://127.0.0.1:{port}/json/list") as r:
                    pages = [t for t in await r.json() if t.get("type") == "page"]
                if pages:
                    ws_url = pages[0]["webSocketDebuggerUrl"]
                    break
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("chromium has no page target")
            await asyncio.sleep(0.05)
        self._ws = await self._http.ws_connect(ws_url, max_msg_size=64 * 2**20)

    async def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 15.0) -> Any:
        assert self._ws is not None, "start() first"
        msg_id = next(self._ids)
        await self._ws.send_str(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
        async with asyncio.timeout(timeout):
            while True:
                msg = await self._ws.receive()
                if msg.type != aiohttp.WSMsgType.TEXT:
                    raise RuntimeError(f"DevTools connection ended: {msg.type}")
                data = json.loads(msg.data)
                if data.get("id") == msg_id:
                    if "error" in data:
                        raise RuntimeError(f"{method}: {data['error']}")
                    return data.get("result", {})

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    async def screenshot(self, path: Path) -> None:
        result = await self.send("Page.captureScreenshot", {"format": "png"})
        await asyncio.to_thread(_write, path, base64.b64decode(result["data"]))

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                async with asyncio.timeout(10):
                    await self.proc.wait()
            except TimeoutError:
                os.killpg(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()
