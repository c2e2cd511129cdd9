"""Local servers that speak the webhook formats of Mattermost, Discord, Microsoft Teams (Workflows), Google Chat,
Opsgenie and plain JSON, for the `notify` action's tests: Apprise posts to them as it would to the real services.

Mattermost and JSON are reached over plain HTTP on loopback. Apprise sends Discord and Google Chat to their own
hosts over HTTPS, so those tests set HTTPS_PROXY to `ConnectProxy`, which tunnels every CONNECT to the local TLS
server (a self-signed certificate made with openssl; the URLs say `verify=no`); so do Opsgenie's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import subprocess
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer


def self_signed(folder: Path) -> ssl.SSLContext:
    """A server TLS context with a fresh self-signed certificate for localhost."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
                    "-days", "1", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


class WebhookServices:
    """Records each post as (service, path, headers, JSON body) and answers as the service does."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.posts: list[dict[str, Any]] = []
        self.statuses: list[int] = []  # answered in turn before the normal answer
        app = web.Application()
        app.router.add_post("/hooks/{token}", self._mattermost)
        app.router.add_post("/api/webhooks/{id}/{token}", self._discord)
        app.router.add_post("/v1/spaces/{space}/messages", self._gchat)
        app.router.add_post("/workflows/{workflow}/triggers/manual/paths/invoke", self._teams)
        app.router.add_post("/v2/alerts", self._opsgenie)
        app.router.add_post("/{tail:.*}", self._json)
        self.server = TestServer(app, host="127.0.0.1")
        self.tls = tls

    async def start(self) -> None:
        await self.server.start_server(ssl=self.tls)

    async def close(self) -> None:
        await self.server.close()

    @property
    def port(self) -> int:
        assert self.server.port is not None
        return self.server.port

    async def _record(self, service: str, request: web.Request) -> web.Response | None:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        self.posts.append({"service": service, "path": request.path, "query": dict(request.query),
                           "headers": dict(request.headers), "body": body, "host": request.headers.get("Host")})
        if self.statuses:
            status = self.statuses.pop(0)
            return web.json_response({"message": "try again"}, status=status)
        return None

    async def _mattermost(self, request: web.Request) -> web.Response:
        return await self._record("mattermost", request) or web.Response(text="ok")

    async def _discord(self, request: web.Request) -> web.Response:
        return await self._record("discord", request) or web.Response(status=204)

    async def _gchat(self, request: web.Request) -> web.Response:
        return await self._record("gchat", request) or web.json_response({"name": "spaces/x/messages/1"})

    async def _teams(self, request: web.Request) -> web.Response:
        return await self._record("teams", request) or web.Response(status=202)

    async def _opsgenie(self, request: web.Request) -> web.Response:
        return await self._record("opsgenie", request) or web.json_response(
            {"result": "Request will be processed", "took": 0.1, "requestId": f"r{len(self.posts)}"}, status=202)

    async def _json(self, request: web.Request) -> web.Response:
        return await self._record("json", request) or web.json_response({"ok": True})

    def of(self, service: str) -> list[dict[str, Any]]:
        return [p for p in self.posts if p["service"] == service]


class ConnectProxy:
    """An HTTP proxy that answers every CONNECT by tunnelling to one local port (the TLS `WebhookServices`)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.connects: list[str] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        line = head.split(b"\r\n", 1)[0].decode()
        method, target, _ = line.split(" ", 2)
        if method != "CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
            writer.close()
            return
        self.connects.append(target)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
