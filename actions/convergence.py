"""Enforcement converges (DESIGN §3.4; docs/actions.md "Retries"): a destructive remedy that failed for a transient
reason is tried again with backoff while its incident stays open, each try audited, so a remedy refused by a 403
runs once the rights are granted, and one that met a 409 or a rollout runs once the object settles.

Transient (actions/kube.kube_errors, actions/evidence): HTTP 403 (rights are granted without a restart), 409, 429,
5xx, a timeout or a lost connection, a workload whose generation is still rolling out, an API server or scheduler
that cannot be asked. Permanent: any other 4xx (404, 422: the object is gone or the request is wrong), a refusal by
protection, exemption, identity or evidence — trying again would decide the same.

A remedy is tried `actions.retry.max_attempts` times as any action is; past that, only while the engine still keeps
its incident open (the incident's KV record, with the same incident id) and for at most `actions.retry.converge_for`
after it was decided. A request whose incident the runner cannot see (a person's, or a runner without the engine's
store) stops at `max_attempts`."""

from __future__ import annotations

import json
from datetime import datetime

from actions.store import KeyValue
from gpuevents.config import RetryConfig
from gpuevents.records import ActionRequest
from gpuevents.subjects import incident_kv_key


async def incident_open(kv: KeyValue, req: ActionRequest) -> bool:
    """Whether the engine still keeps the request's incident open (the same incident, not a later one)."""
    got = await kv.get(incident_kv_key(req.rule, req.entity_key or req.entity_id))
    if got is None:
        return False
    try:
        record = json.loads(got.value)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("id") == req.incident_id


async def keep_trying(kv: KeyValue, req: ActionRequest, destructive: bool, attempt: int, retry: RetryConfig,
                      now: datetime) -> bool:
    """Whether a try that failed for a transient reason is followed by another."""
    if attempt < retry.max_attempts:
        return True
    if not destructive or req.phase == "resolve" or (now - req.created_at).total_seconds() > retry.converge_for:
        return False
    return await incident_open(kv, req)
