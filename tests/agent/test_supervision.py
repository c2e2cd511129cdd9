"""The agent's helper tasks (kill service, kubelet pod refresh) are restarted when they fail, and kill
commands are answered each in its own task, also after one of them crashed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from agent import runner as agent_runner
from agent.kubelet import PodDirectory
from agent.metrics import AgentCounters
from agent.runner import run_nodes, simulated_agents
from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.clock import SystemClock
from gpuevents.commands import KillCommand, KillReply
from gpuevents.config import AgentConfig, Config, NatsConfig, ProtectConfig
from gpuevents.config.kube import KubeletConfig
from gpuevents.events import Event
from tests.agent.test_attribution import POD_UID, kubelet  # noqa: F401  (the fixture)
from tests.waiting import wait_for

KILL_SUBJECT = S.command_subject("c1", "sim-000", "kill")
POWER_CAP_SUBJECT = S.command_subject("c1", "sim-000", "power_cap")  # served by the same service
DIAGNOSE_SUBJECT = S.command_subject("c1", "sim-000", "diagnose")  # and this one


@pytest.fixture(autouse=True)
def quick_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_runner, "RESTART_BACKOFF_S", 0.02)


def config(nats: NatsConfig) -> Config:
    return Config(cluster="c1", nats=nats, protect=ProtectConfig(users=[]),
                  agent=AgentConfig(node_name="sim-000", sample_interval=0.1, snapshot_interval=1))


class FlakyBus:
    """The real bus, except that the first `failures` subscriptions fail (NATS went away meanwhile)."""

    def __init__(self, bus: Bus, failures: int = 0) -> None:
        self.bus = bus
        self.failures = failures
        self.subscribed: list[str] = []

    @property
    def connected(self) -> bool:
        return self.bus.connected

    def publish_event(self, event: Event) -> None:
        self.bus.publish_event(event)

    async def serve(self, subject: str, handler: Any, queue: str | None = None, **kw: Any) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("nats: connection closed")
        self.subscribed.append(subject)
        return await self.bus.serve(subject, handler, queue, **kw)


class Running:
    """One simulated agent in `run_nodes` until the test ends."""

    def __init__(self, cfg: Config, bus: Any, pods: PodDirectory | None = None) -> None:
        self.agents = simulated_agents(cfg, nodes=1, gpus_per_node=2, scenario="demo",
                                       start=datetime.now(UTC))
        self.stop = asyncio.Event()
        self.counters = AgentCounters()
        self.task = asyncio.create_task(run_nodes(self.agents, bus, config=cfg, clock=SystemClock(),
                                                  stop=self.stop, counters=self.counters, pods=pods))

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 10)


@pytest.fixture
async def running() -> AsyncIterator[list[Running]]:
    started: list[Running] = []
    yield started
    for r in started:
        await r.close()


def command(pid: int = 999_999) -> bytes:
    return KillCommand(pid=pid, create_time=datetime(2026, 1, 1, tzinfo=UTC), grace_s=1).model_dump_json().encode()


async def ask(bus: Bus, payload: bytes) -> bytes:
    async def answered() -> bytes | None:
        try:
            return await bus.request(KILL_SUBJECT, payload, timeout=2)
        except Exception:  # not subscribed yet
            return None

    return await wait_for(answered, timeout=10, what="an answer on the kill subject")


async def test_the_kill_service_is_restarted_when_subscribing_fails(
        bus: Bus, nats_config: NatsConfig, running: list[Running], caplog: pytest.LogCaptureFixture) -> None:
    flaky = FlakyBus(bus, failures=2)
    r = Running(config(nats_config), flaky)
    running.append(r)
    with caplog.at_level(logging.ERROR, logger="agent.runner"):
        reply = KillReply.model_validate_json(await ask(bus, command()))
    assert (reply.outcome, reply.reason) == ("gone", "no such process")
    assert r.counters.restarts == {"kill service": 2}
    # one subscription each, not one per attempt
    assert flaky.subscribed == [KILL_SUBJECT, POWER_CAP_SUBJECT, DIAGNOSE_SUBJECT]
    restarts = [m for m in caplog.messages if m.startswith("kill service failed")]
    assert len(restarts) == 2 and "ConnectionError: nats: connection closed" in restarts[0]


async def test_kills_are_still_answered_after_a_handler_crash(
        bus: Bus, nats_config: NatsConfig, running: list[Running], monkeypatch: pytest.MonkeyPatch) -> None:
    r = Running(config(nats_config), bus)
    running.append(r)
    handler = r.agents[0].kill
    real = handler.handle
    crashes = [RuntimeError("psutil blew up")]

    async def crashing(cmd: KillCommand) -> KillReply:
        if crashes:
            raise crashes.pop()
        return await real(cmd)

    monkeypatch.setattr(handler, "handle", crashing)
    first = orjson.loads(await ask(bus, command()))
    assert first == {"error": "RuntimeError: psutil blew up"}
    second = KillReply.model_validate_json(await bus.request(KILL_SUBJECT, command(), timeout=5))
    assert second.outcome == "gone"
    assert r.counters.restarts == {}


async def test_kill_commands_are_answered_concurrently(
        bus: Bus, nats_config: NatsConfig, running: list[Running], monkeypatch: pytest.MonkeyPatch) -> None:
    r = Running(config(nats_config), bus)
    running.append(r)
    handler = r.agents[0].kill
    release = asyncio.Event()
    entered: list[int] = []

    async def slow(cmd: KillCommand) -> KillReply:
        entered.append(cmd.pid)
        await release.wait()
        return KillReply(outcome="gone", pid=cmd.pid)

    await ask(bus, command())  # subscribed
    monkeypatch.setattr(handler, "handle", slow)
    pending = [asyncio.create_task(bus.request(KILL_SUBJECT, command(pid), timeout=10)) for pid in (11, 12, 13)]
    # All three are inside the handler at once: none waits for another to finish.
    await wait_for(lambda: sorted(entered) == [11, 12, 13], what="three commands in progress together")
    release.set()
    replies = [KillReply.model_validate_json(raw) for raw in await asyncio.gather(*pending)]
    assert sorted(x.pid for x in replies) == [11, 12, 13]


async def test_a_failing_pod_refresh_is_restarted(
        bus: Bus, nats_config: NatsConfig, running: list[Running], tmp_path: Path,
        kubelet: tuple[str, list[str]], caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    url, auth = kubelet
    token = tmp_path / "token"
    token.mkdir()  # unreadable as a file: refresh raises IsADirectoryError
    cfg = config(nats_config)
    pods = PodDirectory(KubeletConfig(url=url, token_file=token, refresh=60))
    with caplog.at_level(logging.ERROR, logger="agent.runner"):
        r = Running(cfg, bus, pods)
        running.append(r)
        await wait_for(lambda: r.counters.restarts.get("kubelet pod refresh", 0) >= 2,
                       what="the pod refresh to be restarted")
        token.rmdir()
        token.write_text("s3cret\n")
        await wait_for(lambda: pods.get(POD_UID) is not None, what="pods after the token is readable")
    assert auth[-1] == "Bearer s3cret"
    assert any(m.startswith("kubelet pod refresh failed: IsADirectoryError") for m in caplog.messages)
    assert not r.task.done()
