"""The role users of deploy/nats/nats_auth.py (DESIGN §7.1) on a real nats-server: who may not read or command what,
and a person's kill going through the engine, dry run and audit included, from the real command line."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import nats
import nats.errors
import pytest
import yaml
from nats.aio.msg import Msg

from actions.runner import ActionRunner
from gpuevents import subjects as S
from gpuevents.bus import Message
from gpuevents.clock import SystemClock
from gpuevents.config import Config
from rules.engine.service import Engine
from tests.deploy.conftest import AuthServer
from tests.deploy.test_nats_permissions import bus_as, collect, connect
from tests.rules.engine.conftest import IDLE_RULES, snapshot
from tests.rules.engine.helpers import audit_records, running
from tests.waiting import wait_for

GPUEVENTS = [sys.executable, "-m", "gpuevents.cli"]


async def test_a_node_cannot_read_other_inboxes_other_snapshots_nor_action_requests(
    nats_auth_server: AuthServer,
) -> None:
    server = nats_auth_server
    async with connect(server, *server.agent("n1")) as n1, connect(server, *server.agent("n2")) as n2, \
            connect(server, *server.role("runner"), S.inbox_prefix("runner")) as runner:
        assert n1.nc is not None and n2.nc is not None and runner.nc is not None
        wanted = ["_INBOX.>", "_INBOX.agent.c1.n2.>", "_INBOX.runner.>", "_INBOX.engine.>", "_INBOX.operator.>",
                  S.node_events_filter("c1", "n2"), S.ACTIONS_ALL]
        got = {subject: await collect(n1.nc, subject) for subject in wanted}
        await n1.nc.publish(f"$JS.API.CONSUMER.CREATE.{S.STREAM_ACTIONS}", b"{}")
        await n1.nc.flush()
        await wait_for(lambda: n1.violations("publish", f"$JS.API.CONSUMER.CREATE.{S.STREAM_ACTIONS}"), 5,
                       what=f"the consumer-create violation; got {n1.errors}")
        for subject in wanted:
            assert n1.violations("subscription", subject), (subject, n1.errors)

        # real traffic: n2 answers a runner's command on the runner's inbox; n1 sees none of it
        async def answer(msg: Msg) -> None:
            await msg.respond(b"done by n2")

        await n2.nc.subscribe(S.node_commands_filter("c1", "n2"), cb=answer)
        await n2.nc.flush()
        replies: list[Msg] = []

        async def answered() -> bool:  # until the server routes to n2's new subscription
            with contextlib.suppress(nats.errors.NoRespondersError):
                assert runner.nc is not None
                replies.append(await runner.nc.request(S.command_subject("c1", "n2", "kill"), b"{}", timeout=5))
            return bool(replies)

        await wait_for(answered, 10, what="n2's answer to the runner")
        assert replies[0].data == b"done by n2" and replies[0].subject.startswith("_INBOX.runner.")
    assert {s: len(m) for s, m in got.items()} == dict.fromkeys(wanted, 0)


@pytest.mark.parametrize("verb", ["kill", "diagnose"])
async def test_only_a_runner_commands_agents_never_the_operator(nats_auth_server: AuthServer, verb: str) -> None:
    server = nats_auth_server
    async with connect(server, *server.agent("n1")) as n1, connect(server, *server.role("operator")) as op, \
            connect(server, *server.role("runner")) as runner, connect(server, *server.agent("n2")) as n2:
        assert n1.nc is not None and op.nc is not None and runner.nc is not None and n2.nc is not None
        got = await collect(n1.nc, S.node_commands_filter("c1", "n1"))
        await n2.nc.publish(S.command_subject("c1", "n1", verb), b"from another node")
        await n2.nc.flush()
        await op.nc.publish(S.command_subject("c1", "n1", verb), b"from the operator")
        await op.nc.publish(S.function_subject("anything"), b"from the operator")
        await op.nc.publish(f"$KV.{S.KV_BUCKET}.lease.engine", b"{}")
        await op.nc.flush()
        await runner.nc.publish(S.command_subject("c1", "n1", verb), b"from the runner")
        await runner.nc.flush()
        await wait_for(lambda: len(got) == 1, 5, what="the runner's command")
        await wait_for(lambda: op.violations("publish", f"$KV.{S.KV_BUCKET}.lease.engine"), 5,
                       what=f"the operator's last violation; got {op.errors}")
        assert op.violations("publish", S.command_subject("c1", "n1", verb))
        assert n2.violations("publish", S.command_subject("c1", "n1", verb))
        assert op.violations("publish", S.function_subject("anything"))
    assert [m.data for m in got] == [b"from the runner"]


def _knows(engine: Engine, node: str) -> bool:
    return any(ns.name == node for ns in engine.core.state.nodes.values())


def _config(server: AuthServer, tmp_path: Path) -> Path:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "idle.yaml").write_text(IDLE_RULES)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "cluster": "c1",
        "nats": {"url": server.url, "connect_timeout": "2s", "publish_timeout": "2s", "reconnect_wait": "0.2s"},
        "engine": {"rules": [str(rules)], "dry_run": True, "lease_ttl": "10s", "tick": "30s",
                   "usage_db": str(tmp_path / "usage.sqlite")},
        "agent": {"snapshot_interval": "1h"},
    }))
    return path


def _cli(args: list[str], server: AuthServer, role: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    user, password = server.role(role)
    env = {**os.environ, "NATS_USER": user, "NATS_PASSWORD": password, "HOME": str(tmp_path)}
    return subprocess.run([*GPUEVENTS, *args], capture_output=True, text=True, timeout=60, env=env,
                          cwd=Path(__file__).resolve().parents[2])


async def test_a_kill_from_the_command_line_is_decided_by_the_engine_dry_run_and_audited(
    nats_auth_server: AuthServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The operator's `gpuevents kill` with engine.dry_run: dry run, audited, and no command reaches the agent
    (before, the CLI held the engine's login and the agent answered `killed`)."""
    server = nats_auth_server
    path = _config(server, tmp_path)
    cfg = Config.model_validate(yaml.safe_load(path.read_text()))
    commands: list[bytes] = []

    async def agent_answers(msg: Message) -> bytes:
        commands.append(msg.data)
        return json.dumps({"pid": 4242, "outcome": "killed"}).encode()

    async with bus_as(server, *server.agent("n1"), monkeypatch, "agent", "n1") as agent, \
            bus_as(server, *server.role("engine"), monkeypatch, "engine") as engine_bus, \
            bus_as(server, *server.role("runner"), monkeypatch, "runner") as runner_bus:
        await agent.serve(S.node_commands_filter("c1", "n1"), agent_answers)
        await engine_bus.ensure_streams()
        stop = asyncio.Event()
        runner = asyncio.create_task((await ActionRunner.open(runner_bus, cfg, SystemClock(), name="r0")).run(stop))
        try:
            async with running(await Engine.open(cfg, engine_bus)) as engine:
                at = datetime.now(UTC).replace(microsecond=0)
                agent.publish_event(snapshot("n1", at, pid=4242))
                assert await agent.flush(5)
                await wait_for(lambda: _knows(engine, "n1"), 10, what="the engine to apply the snapshot")
                done = await asyncio.to_thread(_cli, ["kill", "n1", "4242", "--reason", "stuck", "-c", str(path)],
                                               server, "operator", tmp_path)
                assert done.returncode == 0, done.stdout + done.stderr
                assert "dry run" in done.stdout

                async def runner_recorded() -> list[str]:
                    return [r.outcome or "" for r in await audit_records(engine_bus)
                            if r.kind == "action" and r.rule == "operator"]

                assert await wait_for(runner_recorded, 10, what="the runner's record") == ["dry_run"]
                records = [r for r in await audit_records(engine_bus) if r.rule == "operator"]
                one_node = ["status", "--node", "n1", "--json", "-c", str(path)]
                status = await asyncio.to_thread(_cli, one_node, server, "operator", tmp_path)
                # where the engine runs, with its login (docs/deploy.md: kubectl exec ... gpuevents status)
                status_there = await asyncio.to_thread(_cli, one_node, server, "engine", tmp_path)
        finally:
            stop.set()
            await asyncio.wait_for(runner, 15)
        shown = await asyncio.to_thread(_cli, ["audit", "--json", "-c", str(path)], server, "operator", tmp_path)
    assert commands == []
    request = next(r for r in records if r.kind == "request")
    assert (request.action_type, request.outcome, request.dry_run) == ("kill", "dry_run", True)
    assert request.entity_id.endswith("4242") and "asked by" in (request.detail or "")
    assert status.returncode == 0, status.stderr
    assert [n["name"] for n in json.loads(status.stdout)["nodes"]] == ["n1"]
    assert status_there.returncode == 0, status_there.stderr
    assert [n["name"] for n in json.loads(status_there.stdout)["nodes"]] == ["n1"]
    assert shown.returncode == 0, shown.stderr
    assert {json.loads(line)["kind"] for line in shown.stdout.splitlines()} >= {"request", "action"}


async def test_runners_apart_may_log_in_as_the_engine_as_deploy_runs_them(
    nats_auth_server: AuthServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """deploy/kubernetes/runner.yaml and gpuevents-runner@.service run `gpuevents runner` with the
    engine's login: its replies come back on the runners' inbox, which that login may read."""
    server = nats_auth_server

    async def answer(msg: Message) -> bytes:
        return b"done"

    async with bus_as(server, *server.agent("n1"), monkeypatch, "agent", "n1") as agent:
        await agent.serve(S.node_commands_filter("c1", "n1"), answer)
        async with bus_as(server, *server.role("engine"), monkeypatch, "runner") as runner:
            assert await runner.request(S.command_subject("c1", "n1", "kill"), b"{}", timeout=5) == b"done"


def test_an_engine_generated_without_runners_may_not_command_agents(nats_auth: ModuleType) -> None:
    with_runners = nats_auth.role_permissions("engine")
    without = nats_auth.role_permissions("engine", engine_runs_actions=False)
    assert with_runners.publish == (">",) and "_INBOX.runner.>" in with_runners.subscribe
    assert not any(p.startswith(("gpuevents.cmd", "gpuevents.fn", ">")) for p in without.publish)
    assert "_INBOX.runner.>" not in without.subscribe


async def test_the_operator_reads_the_audit_through_its_own_consumers_and_cannot_touch_another(
    nats_auth_server: AuthServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exporter's durable consumer on the audit stream is out of the operator's reach: it may not delete it,
    read from it, nor create one of its own name; its own reads leave no consumer behind."""
    server = nats_auth_server
    async with bus_as(server, *server.role("engine"), monkeypatch, "engine") as engine_bus:
        await engine_bus.ensure_streams()
        await engine_bus.js_publish(S.audit_subject("r1"), b'{"kind": "action"}')
        nc = await nats.connect(server.url, user=server.role("admin")[0], password=server.role("admin")[1])
        try:
            jsm = nc.jetstream()
            await jsm.add_consumer(S.STREAM_AUDIT, durable_name="siem-exporter", ack_policy="explicit")
            async with connect(server, *server.role("operator"), S.inbox_prefix("operator")) as op:
                assert op.nc is not None
                audit = f"$JS.API.CONSUMER.%s.{S.STREAM_AUDIT}.siem-exporter"
                for subject in (audit % "DELETE", audit % "MSG.NEXT", audit % "CREATE"):
                    await op.nc.publish(subject, b"{}")
                await op.nc.flush()
                for subject in (audit % "DELETE", audit % "MSG.NEXT", audit % "CREATE"):
                    await wait_for(functools.partial(op.violations, "publish", subject), 5,
                                   what=f"the operator refused {subject}; got {op.errors}")
            async with bus_as(server, *server.role("operator"), monkeypatch, "operator") as operator:
                read = [m.subject async for m in operator.replay(S.STREAM_AUDIT, S.AUDIT_ALL)]
            assert read == [S.audit_subject("r1")]
            assert [c.name for c in await jsm.consumers_info(S.STREAM_AUDIT)] == ["siem-exporter"]
        finally:
            await nc.close()
