"""Fixtures for the action tests: configs, requests, and the fake Slack and Kubernetes servers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.config import Config
from gpuevents.records import ActionRequest, AuditRecord, action_message, decode_audit
from tests.actions.fakes import FakeKubernetes, FakeSlack, FakeWebhook, SlackUser

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def make_config(**sections: Any) -> Config:
    """A Config with fast retries and short timeouts; `sections` merge over it (nested dicts)."""
    base: dict[str, Any] = {"actions": {"timeout": 5, "retry": {"max_attempts": 3, "backoff": 0.05,
                                                                "backoff_max": 0.2}}}
    for name, value in sections.items():
        if isinstance(value, dict) and isinstance(base.get(name), dict):
            base[name] = {**base[name], **value}
        else:
            base[name] = value
    return Config.model_validate(base)


_counter = 0


def make_request(type_: str, params: dict[str, Any] | None = None, *, key: str | None = None,
                 entity_kind: str = "gpu", entity_id: str = "n1/gpu0", node: str | None = "n1",
                 facts: dict[str, Any] | None = None, rule: str = "idle-gpu-2h", **extra: Any) -> ActionRequest:
    global _counter
    _counter += 1
    return ActionRequest.model_validate({
        "key": key or f"inc-{_counter}:fire:0:0", "type": type_, "params": {"type": type_, **(params or {})},
        "rule": rule, "entity_id": entity_id, "entity_kind": entity_kind, "node": node,
        "incident_id": f"inc-{_counter}", "created_at": datetime.now(UTC), "facts": facts or {}, **extra,
    })


async def publish_request(bus: Bus, request: ActionRequest) -> int:
    """Hand a request to the runners as the engine does (`action_message`: the key is the message id)."""
    subject, payload, msg_id = action_message(request)
    return await bus.js_publish(subject, payload, msg_id=msg_id)


def process_facts(*procs: tuple[int, str, str], node: str = "n1") -> dict[str, Any]:
    """facts.processes as the engine sends them: (pid, user, name) with a create time; the program is
    /usr/bin/<name>."""
    return {"node": {"name": node, "labels": {}},
            "processes": [{"pid": pid, "user": user, "name": name, "exe": f"/usr/bin/{name}",
                           "create_time": T0.isoformat()} for pid, user, name in procs]}


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    server = FakeSlack([
        SlackUser("U001", "alice", "alice@example.com", "Alice"),
        SlackUser("U002", "bob", "bob@example.com", "bobby"),
        SlackUser("U003", "carol", "carol@example.com"),
    ])
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
async def kube() -> AsyncIterator[FakeKubernetes]:
    server = FakeKubernetes()
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@pytest.fixture
def kubeconfig(kube: FakeKubernetes, tmp_path: Path) -> Path:
    return kube.kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
async def webhook() -> AsyncIterator[FakeWebhook]:
    server = FakeWebhook()
    await server.start()
    try:
        yield server
    finally:
        await server.close()


async def audit_records(bus: Bus) -> list[AuditRecord]:
    """Everything in GPUEVENTS_AUDIT, oldest first."""
    return [r async for m in bus.replay(S.STREAM_AUDIT, S.AUDIT_ALL) for r in decode_audit(m.data)]
