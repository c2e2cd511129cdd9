"""The `webhook` action: an HTTP request with a JSON body; 5xx and lost connections are retried, 4xx not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

import aiohttp
import orjson
from pydantic import Field

from actions.escaping import header_value, json_string, no_escape, url_component
from actions.procrun import clip
from actions.protocol import (
    ALL_KINDS,
    ActionContext,
    ActionParams,
    ActionResult,
    ActionUnit,
    PermanentError,
    TransientError,
)
from actions.registry import register
from actions.services import services_of
from gpuevents.durations import Duration
from gpuevents.events import dumps

RESPONSE_MAX = 1024


class WebhookParams(ActionParams):
    type: Literal["webhook"] = "webhook"
    url: str = Field(pattern=r"^https?://")
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict)
    body: Any = Field(default=None, description="JSON (a mapping, a list, or a string holding JSON); "
                      "unset: the incident")
    timeout: Duration | None = None


def request_body(ctx: ActionContext, body: Any) -> tuple[bytes, str]:
    """(payload, content type): JSON when the body is data or a string that parses as JSON."""
    if body is None:
        req = ctx.request
        body = {"rule": req.rule, "entity_id": req.entity_id, "entity_kind": req.entity_kind,
                "cluster": req.cluster, "node": req.node, "incident_id": req.incident_id,
                "phase": req.phase, "key": req.key, "facts": req.facts}
    if isinstance(body, str):
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError:
            return body.encode(), "text/plain; charset=utf-8"
        return body.encode(), "application/json"
    return dumps(body), "application/json"


def _retry_after(headers: Any) -> float | None:
    try:
        return float(headers.get("Retry-After"))
    except (TypeError, ValueError):
        return None


@register
class WebhookAction:
    type: ClassVar[str] = "webhook"
    params = WebhookParams
    entity_kinds = ALL_KINDS
    destructive: ClassVar[bool] = False
    unit: ClassVar[ActionUnit] = "entity"
    escape = staticmethod(no_escape)

    @staticmethod
    def escape_at(path: tuple[str | int, ...]) -> Callable[[str], str]:
        """Once, for where the value lands: the URL percent-encoded, a string body (JSON text) JSON-escaped, a
        mapping body left to the JSON encoder, headers without CR/LF."""
        top = path[0] if path else None
        if top == "url":
            return url_component
        if top == "body":
            return json_string if len(path) == 1 else no_escape
        if top == "headers":
            return header_value
        return no_escape

    async def run(self, ctx: ActionContext) -> ActionResult:
        p = ctx.params
        assert isinstance(p, WebhookParams)
        payload, content_type = request_body(ctx, p.body)
        headers = {"Content-Type": content_type, "Idempotency-Key": ctx.request.key, **p.headers}
        timeout = aiohttp.ClientTimeout(total=(p.timeout or ctx.config.actions.timeout) * 0.95)
        session = services_of(ctx).http()
        try:
            async with session.request(p.method, p.url, data=payload if p.method != "GET" else None,
                                       headers=headers, timeout=timeout) as resp:
                text = clip(await resp.text(errors="replace"), RESPONSE_MAX)
                status = resp.status
                retry_after = _retry_after(resp.headers)
        except (TimeoutError, aiohttp.ClientConnectionError) as e:
            raise TransientError(f"{p.method} {p.url}: {type(e).__name__}: {e}") from None
        except aiohttp.ClientError as e:
            raise PermanentError(f"{p.method} {p.url}: {e}") from None
        detail = f"{p.method} {p.url} -> HTTP {status}"
        if status == 429 or status >= 500:
            raise TransientError(f"{detail}: {text}", retry_after if status == 429 else None)
        if status >= 400:
            raise PermanentError(f"{detail}: {text}")
        return ActionResult(detail=detail, data={"status": status, "response": text})
