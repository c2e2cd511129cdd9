"""The per-node NATS users of deploy/nats/nats_auth.py, exercised against a real nats-server."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol

import nats
import nats.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from gpuevents import subjects as S
from gpuevents.bus import Bus, Message
from gpuevents.config import NatsConfig
from gpuevents.events import AgentInfo, make_event
from tests.deploy.conftest import DEPLOY, AuthServer
from tests.waiting import wait_for


class Conn:
    """A raw nats-py connection that records the asynchronous errors the server sends."""

    def __init__(self) -> None:
        self.nc: Client | None = None
        self.errors: list[str] = []

    def violations(self, kind: str, subject: str) -> bool:
        """Whether the server refused a `kind` ("publish", "subscription") on `subject`.

        nats-py lower-cases the server's error text, subject included.
        """
        wanted = f"permissions violation for {kind} to {subject}".lower()
        return any(wanted in e.lower().replace('"', "") for e in self.errors)


class Reachable(Protocol):
    """Anything with a NATS url: the fixture's server, or a server of tests/nats_sites.py."""

    @property
    def url(self) -> str: ...


@asynccontextmanager
async def connect(server: Reachable, user: str, password: str, inbox_prefix: str = "_INBOX") -> AsyncIterator[Conn]:
    conn = Conn()

    async def on_error(e: Exception) -> None:
        conn.errors.append(str(e))

    conn.nc = await nats.connect(server.url, user=user, password=password, error_cb=on_error,
                                 allow_reconnect=False, connect_timeout=2, inbox_prefix=inbox_prefix)
    try:
        yield conn
    finally:
        await conn.nc.close()


async def collect(nc: Client, subject: str) -> list[Msg]:
    got: list[Msg] = []

    async def cb(msg: Msg) -> None:
        got.append(msg)

    await nc.subscribe(subject, cb=cb)
    await nc.flush()
    return got


def subjects_of(msgs: list[Msg]) -> Callable[[], list[str]]:
    return lambda: [m.subject for m in msgs]


@asynccontextmanager
async def bus_as(server: AuthServer, user: str, password: str, monkeypatch: pytest.MonkeyPatch,
                 role: str = "engine", node: str | None = None) -> AsyncIterator[Bus]:
    """The real gpuevents Bus, logged in as `user` (the bus reads NATS_USER/NATS_PASSWORD) with `role`'s inbox."""
    monkeypatch.setenv("NATS_USER", user)
    monkeypatch.setenv("NATS_PASSWORD", password)
    bus = Bus(NatsConfig(url=server.url, connect_timeout=2, publish_timeout=2, reconnect_wait=0.2),
              name=user, role=role, node=node, cluster=server.cluster)
    await bus.connect()
    try:
        yield bus
    finally:
        await bus.close(flush_timeout=1)


async def test_agent_bus_stores_its_own_events_in_the_stream(
    nats_auth_server: AuthServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = nats_auth_server
    async with bus_as(server, server.engine_user, server.engine_password, monkeypatch) as engine:
        await engine.ensure_streams()
        # a node name with dots: the permission must use the same escaping as the agent's subjects
        for node in ("n1", "gpu-7.example.com"):
            user, password = server.agent(node)
            async with bus_as(server, user, password, monkeypatch, "agent", node) as agent:
                agent.publish_event(make_event("agent.started", node, AgentInfo(node=node),
                                               cluster=server.cluster))
                assert await agent.flush(5), f"{node}'s event was not acknowledged by JetStream"
        stored = [m.subject async for m in engine.replay(S.STREAM_EVENTS, S.EVENTS_ALL)]
    assert stored == [
        S.event_subject("c1", "n1", "agent.started"),
        S.event_subject("c1", "gpu-7.example.com", "agent.started"),
    ]


async def test_agent_answers_commands_to_its_own_node(
    nats_auth_server: AuthServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = nats_auth_server
    user, password = server.agent("n1")
    async with bus_as(server, user, password, monkeypatch, "agent", "n1") as agent:

        async def handler(msg: Message) -> bytes:
            return b"done:" + msg.data

        await agent.serve(S.node_commands_filter("c1", "n1"), handler)
        async with bus_as(server, *server.role("runner"), monkeypatch, "runner") as runner:
            reply = await runner.request(S.command_subject("c1", "n1", "kill"), b"4242", timeout=5)
    assert reply == b"done:4242"


async def test_agent_cannot_publish_as_another_node(nats_auth_server: AuthServer) -> None:
    server = nats_auth_server
    async with connect(server, *server.role("admin")) as watcher:
        assert watcher.nc is not None
        seen = await collect(watcher.nc, "gpuevents.>")
        async with connect(server, *server.agent("n1")) as agent:
            assert agent.nc is not None
            forged = S.event_subject("c1", "n2", "gpu.idle")
            own = S.event_subject("c1", "n1", "gpu.idle")
            await agent.nc.publish(forged, b"forged")
            await agent.nc.publish(own, b"own")
            await agent.nc.flush()
            # Messages from one connection arrive in order: once `own` is seen, `forged` would
            # have been seen before it had the server let it through.
            await wait_for(lambda: own in subjects_of(seen)(), 5, what="the agent's own event")
            await wait_for(lambda: agent.violations("publish", forged), 5,
                           what="a publish permissions violation")
    assert subjects_of(seen)() == [own]


async def test_agent_cannot_receive_another_nodes_commands(nats_auth_server: AuthServer) -> None:
    server = nats_auth_server
    async with connect(server, *server.agent("n1")) as n1, connect(server, *server.agent("n2")) as n2:
        assert n1.nc is not None and n2.nc is not None
        n1_got = await collect(n1.nc, "gpuevents.cmd.>")            # wider than allowed: refused
        n1_other = await collect(n1.nc, S.node_commands_filter("c1", "n2"))  # another node's: refused
        n1_own = await collect(n1.nc, S.node_commands_filter("c1", "n1"))
        n2_own = await collect(n2.nc, S.node_commands_filter("c1", "n2"))
        await wait_for(lambda: n1.violations("subscription", S.node_commands_filter("c1", "n2")),
                       5, what="a subscription permissions violation")
        assert n1.violations("subscription", "gpuevents.cmd.>")
        async with connect(server, *server.role("runner")) as runner:
            assert runner.nc is not None
            await runner.nc.publish(S.command_subject("c1", "n2", "kill"), b"for n2")
            await runner.nc.publish(S.command_subject("c1", "n1", "kill"), b"for n1")
            await runner.nc.flush()
            await wait_for(lambda: len(n1_own) == 1 and len(n2_own) == 1, 5,
                           what="each agent's own command")
    assert [m.data for m in n1_own] == [b"for n1"]
    assert [m.data for m in n2_own] == [b"for n2"]
    assert n1_got == [] and n1_other == []


async def test_agent_cannot_read_other_nodes_events_nor_act_nor_touch_jetstream(
    nats_auth_server: AuthServer,
) -> None:
    server = nats_auth_server
    async with connect(server, *server.agent("n1")) as agent:
        assert agent.nc is not None
        await collect(agent.nc, "gpuevents.evt.>")
        await agent.nc.publish("gpuevents.act.kill", b"{}")
        await agent.nc.publish("gpuevents.cmd.c1.n2.kill", b"{}")
        await agent.nc.publish("$JS.API.STREAM.DELETE.GPUEVENTS", b"")
        await agent.nc.publish("$KV.gpuevents-state.incident", b"{}")
        await agent.nc.flush()
        await wait_for(lambda: agent.violations("publish", "$KV.gpuevents-state.incident"), 5,
                       what=f"the last publish violation; got {agent.errors}")
        assert agent.violations("subscription", "gpuevents.evt.>")
        for subject in ("gpuevents.act.kill", "gpuevents.cmd.c1.n2.kill",
                        "$JS.API.STREAM.DELETE.GPUEVENTS"):
            assert agent.violations("publish", subject), (subject, agent.errors)


async def test_a_wrong_password_or_an_unlisted_node_is_refused(nats_auth_server: AuthServer) -> None:
    server = nats_auth_server
    user, _ = server.agent("n1")
    with pytest.raises(nats.errors.Error, match=r"(?i)authorization"):
        async with connect(server, user, "not-the-password"):
            pass
    with pytest.raises(nats.errors.Error, match=r"(?i)authorization"):
        async with connect(server, "agent/c1/n9", server.agent_passwords["n1"]):
            pass


def start_logged(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=out, cwd=log.parent,
                                start_new_session=True)


async def test_the_real_agent_reports_through_the_image_entrypoint_with_its_node_credentials(
    nats_auth_server: AuthServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`gpuevents agent` as the DaemonSet runs it: entrypoint, password file, env overrides."""
    server = nats_auth_server
    password_file = tmp_path / "nats-agent" / "n1"
    password_file.parent.mkdir()
    password_file.write_text(server.agent_passwords["n1"] + "\n")
    config = tmp_path / "config.yaml"
    config.write_text(
        f"nats: {{url: '{server.url}', reconnect_wait: 0.2s, publish_timeout: 2s}}\n"
        "agent: {sample_interval: 0.2s, snapshot_interval: 0.5s,\n"
        "        simulation: {nodes: 1, gpus_per_node: 2, speedup: 1.0}}\n"
    )
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "GPUEVENTS_CLUSTER": "c1",
        "GPUEVENTS_AGENT__NODE_NAME": "n1",
        "NATS_USER": server.agent("n1")[0],
        "NATS_PASSWORD_FILE": str(password_file),
    }
    async with bus_as(server, server.engine_user, server.engine_password, monkeypatch) as engine:
        await engine.ensure_streams()
        log = tmp_path / "agent.log"
        agent = start_logged(["/bin/sh", str(DEPLOY / "container" / "entrypoint.sh"), "agent",
                              "-c", str(config), "--simulate"], env, log)
        try:
            snapshot = S.event_subject("c1", "n1", "node.snapshot")

            async def stored_snapshot() -> bool:
                info = await engine.stream_info(S.STREAM_EVENTS)
                if not info.state.messages:
                    return False
                return snapshot in [m.subject async for m in engine.replay(S.STREAM_EVENTS, S.EVENTS_ALL)]

            await wait_for(stored_snapshot, 30, interval=0.2,
                           what=f"a snapshot from the agent; its log:\n{log.read_text()[-3000:]}")
        finally:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(20)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait(5)
    # The agent asks for nothing it may not do: it creates no streams (the engine's job).
    refused = re.findall(r'user:agent/c1/n1" - (\w+) Violation - Subject "([^"]+)"', server.log.read_text())
    assert refused == []
