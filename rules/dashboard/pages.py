"""The live dashboard: an aiohttp app with a JSON API and one static page that polls it."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar, cast, get_args

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import BaseModel

from gpuevents.wire.free import FreeQuery, FreeQueryError
from rules.dashboard.fleet_view import AuditResponse, DashboardSource, FleetRows, FleetView
from rules.dashboard.free import free_gpus_sliced
from rules.dashboard.timeline import Per
from rules.dashboard.usage_source import UsageSource

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
SOURCE_KEY = web.AppKey("dashboard_source", DashboardSource)
USAGE_KEY = web.AppKey("dashboard_usage", UsageSource)
# the pages' ES modules and style sheet (no build step, nothing fetched from elsewhere)
ASSETS = ("dashboard.js", "wall.js", "fleet.js", "timeline.js", "free.js", "quarter.js", "colours.js", "common.js",
          "dashboard.css")
MAX_AUDIT = 500
PER_CHOICES: tuple[str, ...] = get_args(Per)
DEFAULT_AUDIT = 50
_NO_STORE = {"Cache-Control": "no-store"}
SLICE = 128  # items serialised between two yields to the event loop (the engine consumes in between)
MAX_PAGE = 100_000
# The page loads nothing from elsewhere and runs no inline script.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
    "script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

T = TypeVar("T")


async def _resolve(value: T | Awaitable[T]) -> T:
    if inspect.isawaitable(value):
        return await value
    return value


def _json(model: BaseModel) -> web.Response:
    return web.Response(body=model.model_dump_json(), content_type="application/json", headers=_NO_STORE)


async def _sliced_json(head: dict[str, Any], key: str, items: list[Any]) -> web.Response:
    """`head` with `items` (pydantic models, or their JSON) under `key`, serialised a slice at a time: a large
    fleet's answer never holds the event loop (and the engine consuming on it) for long."""
    parts = []
    for i, item in enumerate(items):
        parts.append(item if isinstance(item, bytes) else item.model_dump_json().encode())
        if i % SLICE == SLICE - 1:
            await asyncio.sleep(0)
    head[key] = "\0"
    prefix, _, suffix = orjson.dumps(head).partition(b'"\\u0000"')
    return web.Response(body=prefix + b"[" + b",".join(parts) + b"]" + suffix, content_type="application/json",
                        headers=_NO_STORE)


async def _fleet(request: web.Request) -> web.Response:
    """The fleet; `?offset=N&limit=M` for a page of its nodes (the counts are always the whole fleet's)."""
    view: FleetView | FleetRows = await _resolve(request.app[SOURCE_KEY].fleet())
    offset = _whole(request, "offset", 0, 0, 10**9)
    limit = _whole(request, "limit", MAX_PAGE, 1, MAX_PAGE) if "limit" in request.query else None
    end = offset + limit if limit is not None else None
    if isinstance(view, FleetRows):
        head = view.header()
        head.update(total_nodes=len(view.node_json), offset=offset)
        return await _sliced_json(head, "nodes", list(view.node_json[offset:end]))
    counts = {"gpu_count": 0, "busy": 0, "idle": 0, "held_idle": 0}
    for i, node in enumerate(view.nodes):
        counts["gpu_count"] += len(node.gpus)
        for g in node.gpus:
            if g.idle or g.activity_known:  # held with no activity signal is neither
                counts["idle" if g.idle else "busy"] += 1
            counts["held_idle"] += g.held_idle
        if i % (SLICE * 8) == 0:
            await asyncio.sleep(0)
    nodes = view.nodes[offset:end]
    head = view.model_dump(mode="json", exclude={"nodes", *counts})
    head.update(counts, total_nodes=len(view.nodes), offset=offset)
    return await _sliced_json(head, "nodes", nodes)


async def _incidents(request: web.Request) -> web.Response:
    return await _sliced_json({}, "incidents", list(await _resolve(request.app[SOURCE_KEY].incidents())))


async def _free(request: web.Request) -> web.Response:
    try:
        query = FreeQuery.from_params(request.query, request.query.getall("label", []))
    except (FreeQueryError, ValueError) as e:
        raise web.HTTPBadRequest(text=str(e)) from None
    return _json(await free_gpus_sliced(await _resolve(request.app[SOURCE_KEY].fleet()), query))


def _whole(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name, str(default))
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise web.HTTPBadRequest(text=f"{name} must be a whole number from {low} to {high}, got {raw!r}")
    return int(raw)


async def _timeline(request: web.Request) -> web.Response:
    usage = request.app.get(USAGE_KEY)
    if usage is None:
        raise web.HTTPNotFound(text="no usage history here: this dashboard was started without a rollups store")
    hours = _whole(request, "hours", 24, 1, 168)
    limit = _whole(request, "limit", 200, 1, 5000)
    per = request.query.get("per", "auto")
    if per not in PER_CHOICES:
        raise web.HTTPBadRequest(text=f"per must be auto, gpu or node, got {per!r}")
    query = request.query.get("q", "")[:200]
    return _json(await usage.timeline(hours, cast(Per, per), query, limit))


async def _quarter(request: web.Request) -> web.Response:
    usage = request.app.get(USAGE_KEY)
    if usage is None:
        raise web.HTTPNotFound(text="no usage history here: this dashboard was started without a rollups store")
    return _json(await usage.quarter(_whole(request, "weeks", 13, 1, 53)))


async def _audit(request: web.Request) -> web.Response:
    raw = request.query.get("limit", str(DEFAULT_AUDIT))
    try:
        limit = int(raw)
    except ValueError:
        limit = -1
    if not 1 <= limit <= MAX_AUDIT:
        raise web.HTTPBadRequest(text=f"limit must be a whole number from 1 to {MAX_AUDIT}, got {raw!r}")
    records = await _resolve(request.app[SOURCE_KEY].recent_audit(limit))
    return _json(AuditResponse(records=records[:limit]))


def _static(name: str, content_type: str) -> Handler:
    body = (STATIC / name).read_bytes()

    async def handler(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type=content_type, charset="utf-8", headers=_PAGE_HEADERS)

    return handler


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception:
        log.exception("dashboard: %s failed", request.path)
        return web.json_response({"error": "internal error; see the engine log"}, status=500, headers=_NO_STORE)


def make_dashboard_app(source: DashboardSource, usage: UsageSource | None = None) -> web.Application:
    """The app: `/` (the page), `/wall` (the office screen; also `/?view=wall`), `/static/*`,
    `/api/fleet[?offset=N&limit=M]`,
    `/api/incidents`, `/api/audit?limit=N`, `/api/free?count=N&min_free_mem=40G&model=M&label=K=V`, and with
    `usage`, `/api/timeline?hours=24&per=auto|gpu|node&q=TEXT&limit=N` and `/api/quarter?weeks=13` (each team's
    utilization week by week against its target)."""
    app = web.Application(middlewares=[_errors])
    app[SOURCE_KEY] = source
    if usage is not None:
        app[USAGE_KEY] = usage
    page = _static("dashboard.html", "text/html")
    wall = _static("wall.html", "text/html")

    async def index(request: web.Request) -> web.StreamResponse:
        return await (wall if request.query.get("view") == "wall" else page)(request)

    app.router.add_get("/", index)
    app.router.add_get("/wall", wall)
    for name in ASSETS:
        kind = "text/css" if name.endswith(".css") else "text/javascript"
        app.router.add_get(f"/static/{name}", _static(name, kind))
    app.router.add_get("/api/timeline", _timeline)
    app.router.add_get("/api/quarter", _quarter)
    app.router.add_get("/api/fleet", _fleet)
    app.router.add_get("/api/incidents", _incidents)
    app.router.add_get("/api/audit", _audit)
    app.router.add_get("/api/free", _free)
    return app


async def serve_dashboard(source: DashboardSource, host: str, port: int,
                          usage: UsageSource | None = None) -> web.AppRunner:
    """Start serving; `port` 0 picks a free one (see `bound_port`). Stop with `await runner.cleanup()`."""
    runner = web.AppRunner(make_dashboard_app(source, usage), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("dashboard on http://%s:%d/", host, bound_port(runner))
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port the dashboard listens on (useful after asking for port 0)."""
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise RuntimeError("the dashboard is not listening")
