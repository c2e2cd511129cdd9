"""Local stand-ins for the Slack Web API and the Kubernetes API, served by aiohttp for the real clients."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer


@dataclass
class Injected:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class SlackUser:
    id: str
    name: str
    email: str
    display_name: str = ""


class FakeSlack:
    """users.lookupByEmail, users.list (paged), conversations.open, chat.postMessage, chat.update, views.open,
    apps.connections.open and the Socket Mode websocket (hello, envelopes, acks), response URLs; with injected
    failures."""

    def __init__(self, users: list[SlackUser]) -> None:
        self.users = users
        self.posted: list[dict[str, Any]] = []
        self.updated: list[dict[str, Any]] = []
        self.views: list[dict[str, Any]] = []  # modals opened: {"trigger_id", "view", "id"}
        self.responses: list[dict[str, Any]] = []  # what was posted to a response_url (ephemeral replies)
        self.acks: list[str] = []  # Socket Mode envelope ids acknowledged
        self.channel_members: dict[str, list[str]] = {}
        self.calls: list[str] = []
        self.inject: dict[str, list[Injected]] = defaultdict(list)
        self.tokens: set[str] = set()
        self.sockets: list[web.WebSocketResponse] = []
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._dispatch)
        app.router.add_get("/socket", self._socket)
        app.router.add_post("/respond/{id}", self._respond)
        self.server = TestServer(app, host="127.0.0.1")

    async def start(self) -> None:
        await self.server.start_server()

    async def close(self) -> None:
        await self.server.close()

    @property
    def base_url(self) -> str:
        return str(self.server.make_url("/api/"))

    async def _args(self, request: web.Request) -> dict[str, Any]:
        args: dict[str, Any] = dict(request.query)
        if request.can_read_body:
            if request.content_type == "application/json":
                args.update(await request.json())
            else:
                args.update(dict(await request.post()))
        return args

    async def _dispatch(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        self.calls.append(method)
        self.tokens.add(request.headers.get("Authorization", ""))
        queue = self.inject.get(method)
        if queue:
            inj = queue.pop(0)
            return web.json_response(inj.body or {"ok": False, "error": "injected"}, status=inj.status,
                                     headers=inj.headers)
        args = await self._args(request)
        handler = getattr(self, "_" + method.replace(".", "_"), None)
        if handler is None:
            return web.json_response({"ok": False, "error": "unknown_method"})
        return web.json_response(handler(args))

    def _users_lookupByEmail(self, args: dict[str, Any]) -> dict[str, Any]:
        for u in self.users:
            if u.email == args.get("email"):
                return {"ok": True, "user": {"id": u.id, "name": u.name}}
        return {"ok": False, "error": "users_not_found"}

    def _users_list(self, args: dict[str, Any]) -> dict[str, Any]:
        start = int(args.get("cursor") or 0)
        page = self.users[start:start + 2]
        nxt = str(start + 2) if start + 2 < len(self.users) else ""
        members = [{"id": u.id, "name": u.name, "profile": {"display_name": u.display_name, "email": u.email}}
                   for u in page]
        return {"ok": True, "members": members, "response_metadata": {"next_cursor": nxt}}

    def _conversations_open(self, args: dict[str, Any]) -> dict[str, Any]:
        users = args.get("users", "")
        if not any(u.id == users for u in self.users):
            return {"ok": False, "error": "user_not_found"}
        return {"ok": True, "channel": {"id": f"D{users}"}}

    def _chat_postMessage(self, args: dict[str, Any]) -> dict[str, Any]:
        blocks = args.get("blocks")
        if isinstance(blocks, str):
            blocks = json.loads(blocks)
        self.posted.append({"channel": args.get("channel"), "text": args.get("text"), "blocks": blocks,
                            "parse": args.get("parse")})
        return {"ok": True, "channel": args.get("channel"), "ts": f"{len(self.posted)}.000"}

    def _chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        blocks = args.get("blocks")
        if isinstance(blocks, str):
            blocks = json.loads(blocks)
        self.updated.append({"channel": args.get("channel"), "ts": args.get("ts"), "text": args.get("text"),
                             "blocks": blocks})
        return {"ok": True, "channel": args.get("channel"), "ts": args.get("ts")}

    def _views_open(self, args: dict[str, Any]) -> dict[str, Any]:
        view = args.get("view")
        if isinstance(view, str):
            view = json.loads(view)
        if not args.get("trigger_id") or not isinstance(view, dict):
            return {"ok": False, "error": "invalid_arguments"}
        opened = {"trigger_id": args["trigger_id"], "view": view, "id": f"V{len(self.views) + 1}"}
        self.views.append(opened)
        return {"ok": True, "view": {**view, "id": opened["id"]}}

    def submission(self, opened: dict[str, Any], user: str, values: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The `view_submission` payload Slack sends when `user` submits the modal `opened` with `values`
        (block_id -> action_id -> the element's state)."""
        view = {**opened["view"], "id": opened["id"], "state": {"values": values}}
        return {"type": "view_submission", "user": {"id": user}, "view": view}

    def _conversations_members(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "members": self.channel_members.get(str(args.get("channel")), []),
                "response_metadata": {"next_cursor": ""}}

    def _apps_connections_open(self, args: dict[str, Any]) -> dict[str, Any]:
        url = str(self.server.make_url("/socket")).replace("http://", "ws://")
        return {"ok": True, "url": url}

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_json({"type": "hello", "num_connections": 1, "debug_info": {"host": "fake"}})
        self.sockets.append(ws)
        async for msg in ws:
            if msg.type.name == "TEXT":
                data = json.loads(msg.data)
                if "envelope_id" in data:
                    self.acks.append(data["envelope_id"])
        return ws

    async def send_interactive(self, envelope_id: str, payload: dict[str, Any]) -> None:
        """Push an `interactive` envelope to the connected Socket Mode client, as Slack does on a click."""
        await self.sockets[-1].send_json({"envelope_id": envelope_id, "type": "interactive", "payload": payload,
                                          "accepts_response_payload": False, "retry_attempt": 0,
                                          "retry_reason": ""})

    def response_url(self, name: str = "1") -> str:
        return str(self.server.make_url(f"/respond/{name}"))

    async def _respond(self, request: web.Request) -> web.Response:
        self.responses.append(await request.json())
        return web.json_response({"ok": True})

    def dms_to(self, user_id: str) -> list[dict[str, Any]]:
        return [p for p in self.posted if p["channel"] == f"D{user_id}"]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def kube_json(body: Any, status: int = 200) -> web.Response:
    """As the API server answers: exactly `application/json` (lightkube checks for it)."""
    return web.Response(body=json.dumps(body).encode(), status=status,
                        headers={"Content-Type": "application/json"})


# metav1.StatusReason for the codes the API server answers with (k8s.io/apimachinery/pkg/api/errors)
STATUS_REASONS = {403: "Forbidden", 404: "NotFound", 409: "Conflict", 422: "Invalid", 429: "TooManyRequests",
                  500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


class FakeKubernetes:
    """GET/PATCH /api/v1/nodes/{name}; GET/PATCH apps/v1 deployments|statefulsets/{name}/scale.

    Only for what a real API server (tests/kube_cluster.py) does not answer on demand: injected 5xx, 429.
    Errors are Status objects as the server writes them (`application/json`, metav1 reasons)."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.replicas: dict[tuple[str, str, str], int] = {}  # (kind plural, namespace, name)
        self.patches: list[tuple[str, str, Any]] = []  # (path, content type, body)
        self.inject: list[Injected] = []
        app = web.Application()
        app.router.add_route("GET", "/api/v1/nodes/{name}", self._get_node)
        app.router.add_route("PATCH", "/api/v1/nodes/{name}", self._patch_node)
        scale = "/apis/apps/v1/namespaces/{ns}/{plural}/{name}/scale"
        app.router.add_route("GET", scale, self._get_scale)
        app.router.add_route("PATCH", scale, self._patch_scale)
        self.server = TestServer(app, host="127.0.0.1")

    async def start(self) -> None:
        await self.server.start_server()

    async def close(self) -> None:
        await self.server.close()

    def add_node(self, name: str, **spec: Any) -> None:
        self.nodes[name] = {"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": name, "labels": {}, "annotations": {}}, "spec": spec}

    def kubeconfig(self, path: Path) -> Path:
        url = str(self.server.make_url("")).rstrip("/")
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": url}}],
            "users": [{"name": "u", "user": {"token": "test-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u", "namespace": "default"}}],
        }))
        return path

    def _injected(self) -> web.Response | None:
        if self.inject:
            inj = self.inject.pop(0)
            reason = STATUS_REASONS.get(inj.status, "Unknown")
            return kube_json(inj.body or {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                          "message": f"injected {reason}", "reason": reason, "code": inj.status},
                             status=inj.status)
        return None

    @staticmethod
    def _not_found(what: str) -> web.Response:
        return kube_json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                          "message": f"{what} not found", "reason": "NotFound", "code": 404}, status=404)

    async def _get_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.nodes:
            return self._not_found(f'nodes "{name}"')
        return self._injected() or kube_json(self.nodes[name])

    async def _patch_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if (inj := self._injected()) is not None:
            return inj
        if name not in self.nodes:
            return self._not_found(f'nodes "{name}"')
        body = await request.json()
        self.patches.append((request.path, request.content_type, body))
        self.nodes[name] = merge_patch(self.nodes[name], body)
        return kube_json(self.nodes[name])

    def _scale_doc(self, ns: str, plural: str, name: str) -> dict[str, Any]:
        n = self.replicas[(plural, ns, name)]
        return {"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": name, "namespace": ns}, "spec": {"replicas": n}, "status": {"replicas": n}}

    async def _get_scale(self, request: web.Request) -> web.Response:
        ns, plural, name = (request.match_info[k] for k in ("ns", "plural", "name"))
        if (plural, ns, name) not in self.replicas:
            return self._not_found(f'{plural}.apps "{name}"')
        return self._injected() or kube_json(self._scale_doc(ns, plural, name))

    async def _patch_scale(self, request: web.Request) -> web.Response:
        ns, plural, name = (request.match_info[k] for k in ("ns", "plural", "name"))
        if (plural, ns, name) not in self.replicas:
            return self._not_found(f'{plural}.apps "{name}"')
        body = await request.json()
        self.patches.append((request.path, request.content_type, body))
        self.replicas[(plural, ns, name)] = int(body["spec"]["replicas"])
        return kube_json(self._scale_doc(ns, plural, name))


class FakeWebhook:
    """Records every request; answers from `statuses` in turn (then 200)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.server = TestServer(app, host="127.0.0.1")

    async def start(self) -> None:
        await self.server.start_server()

    async def close(self) -> None:
        await self.server.close()

    def url(self, path: str = "/hook") -> str:
        return str(self.server.make_url(path))

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests.append({"method": request.method, "path": request.path, "raw_path": request.raw_path,
                              "query": dict(request.query), "headers": dict(request.headers), "body": body})
        status = self.statuses.pop(0) if self.statuses else 200
        return web.json_response({"status": status}, status=status)

    def keys(self) -> list[str]:
        return [r["headers"].get("Idempotency-Key", "") for r in self.requests]
