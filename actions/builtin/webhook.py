"""The `webhook` action's runtime: an HTTP request with a JSON body; 5xx and lost connections are retried, 4xx not."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from actions.procrun import clip
from actions.protocol import ActionContext, ActionResult, PermanentError, TransientError
from actions.specs.webhook import WebhookParams, WebhookSpec
from gpuevents.events import dumps

RESPONSE_MAX = 1024


def request_body(ctx: ActionContext, body: Any) -> tuple[bytes, str]:
    """(payload, content type): JSON when the body is data or a string that parses as JSON."""
    if body is None:
        req = ctx.request
        body = {"rule": req.rule, "entity_id": req.entity_id, "entity_kind": req.entity_kind,
                "cluster": req.cluster, "node": req.node, "incident_id": req.incident_id,
                "phase": req.phase, "key": req.key, "facts": req.facts.model_dump(mode="json")}
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


class WebhookAction(WebhookSpec):
    async def run(self, params: WebhookParams, ctx: ActionContext) -> ActionResult:
        p = params
        payload, content_type = request_body(ctx, p.body)
        headers = {"Content-Type": content_type, "Idempotency-Key": ctx.request.key, **p.headers}
        timeout = aiohttp.ClientTimeout(total=(p.timeout or ctx.config.actions.timeout) * 0.95)
        session = ctx.services.http()
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
