"""`gpuevents pause|resume|cordon|uncordon` from the real command line, as the operator's NATS login, through the
engine and a runner to a real kube-apiserver (tests/kube_cluster.py): a cordon and its uncordon audited with
the facts the engine used, and a resume of a workload paused by a runner whose store is gone, from the
workload's gpuevents.io/paused annotation alone."""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from lightkube import codecs
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Node

from actions.runner import ActionRunner
from actions.store import MemoryKv
from gpuevents.clock import SystemClock
from gpuevents.config import Config
from rules.engine.service import Engine
from tests.actions.builtin.test_pause import deployment
from tests.actions.conftest import make_config, make_request
from tests.deploy.conftest import AuthServer
from tests.deploy.test_nats_permissions import bus_as
from tests.deploy.test_nats_roles import _cli, _knows
from tests.kube_cluster import KubeCluster
from tests.rules.engine.conftest import IDLE_RULES, snapshot
from tests.rules.engine.helpers import audit_records, running
from tests.waiting import wait_for


def _config(server: AuthServer, tmp_path: Path, kubeconfig: Path) -> Path:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "idle.yaml").write_text(IDLE_RULES)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "cluster": "c1",
        "nats": {"url": server.url, "connect_timeout": "2s", "publish_timeout": "2s", "reconnect_wait": "0.2s"},
        "engine": {"rules": [str(rules)], "dry_run": False, "lease_ttl": "10s", "tick": "30s",
                   "usage_db": str(tmp_path / "usage.sqlite")},
        "agent": {"snapshot_interval": "1h"},
        "actions": {"kubernetes": {"kubeconfig": str(kubeconfig)}},
    }))
    return path


def _unschedulable(kube_cluster: KubeCluster, node: str) -> bool:
    with contextlib.closing(kube_cluster.sync_client()) as c:
        got = c.get(Node, node)
    return bool(got.spec and got.spec.unschedulable)


def _replicas(kube_cluster: KubeCluster, ns: str) -> int | None:
    with contextlib.closing(kube_cluster.sync_client()) as c:
        got = c.get(Deployment, "d", namespace=ns)
    return got.spec.replicas if got.spec else None


async def test_a_persons_cordon_uncordon_and_resume_go_through_the_engine_to_the_cluster(
    nats_auth_server: AuthServer, kube_cluster: KubeCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    server = nats_auth_server
    node = "gpu-7.example.com"  # a node of the NATS server's agent logins (tests/deploy/conftest.py), in the cluster
    kube_cluster.add_gpu_node(node)
    ns = kube_cluster.namespace("ml")
    with contextlib.closing(kube_cluster.sync_client()) as admin:
        admin.create(codecs.from_dict(deployment(ns, "d", 3)))
    # paused by a runner whose store is gone since (a new KV bucket, another cluster's engine)
    gone = await ActionRunner.open(
        None, make_config(actions={"kubernetes": {"kubeconfig": str(kube_cluster.kubeconfig)}}),
        kv=MemoryKv())
    try:
        paused = await gone.process(make_request("pause", {}, entity_kind="job", node=None,  # a person's pause
                                                 facts={"job": {"id": f"{ns}/Deployment/d"}}))
    finally:
        await gone.close()
    assert paused.outcome == "ok" and _replicas(kube_cluster, ns) == 0

    path = _config(server, tmp_path, kube_cluster.kubeconfig)
    cfg = Config.model_validate(yaml.safe_load(path.read_text()))
    async with bus_as(server, *server.agent(node), monkeypatch, "agent", node) as agent, \
            bus_as(server, *server.role("engine"), monkeypatch, "engine") as engine_bus, \
            bus_as(server, *server.role("runner"), monkeypatch, "runner") as runner_bus:
        await engine_bus.ensure_streams()
        stop = asyncio.Event()
        runner = asyncio.create_task((await ActionRunner.open(runner_bus, cfg, SystemClock(), name="r0")).run(stop))
        try:
            async with running(await Engine.open(cfg, engine_bus)) as engine:
                agent.publish_event(snapshot(node, datetime.now(UTC).replace(microsecond=0), pid=4242))
                assert await agent.flush(5)
                await wait_for(lambda: _knows(engine, node), 10, what="the engine to apply the snapshot")

                async def verb(*args: str) -> str:
                    done = await asyncio.to_thread(_cli, [*args, "--reason", "by hand", "-c", str(path)], server,
                                                   "operator", tmp_path)
                    assert done.returncode == 0, done.stdout + done.stderr
                    return done.stdout

                assert "handed to the action runners" in await verb("cordon", node)
                await wait_for(lambda: _unschedulable(kube_cluster, node), 30, what="the node cordoned")
                await verb("uncordon", node)
                await wait_for(lambda: not _unschedulable(kube_cluster, node), 30, what="the node uncordoned")
                await verb("resume", f"{ns}/Deployment/d")  # the engine sees no pod of it: the undo names it
                await wait_for(lambda: _replicas(kube_cluster, ns) == 3, 30, what="the workload resumed")

                async def outcomes() -> list[tuple[str | None, str | None]] | None:
                    records = await audit_records(engine_bus)
                    got: list[tuple[str | None, str | None]] = [
                        (r.action_type, r.outcome) for r in records if r.kind == "action" and r.rule == "operator"]
                    return got if len(got) == 3 else None

                assert await wait_for(outcomes, 15, what="the runner's records") == [
                    ("cordon", "ok"), ("uncordon", "ok"), ("resume", "ok")]
        finally:
            stop.set()
            await asyncio.wait_for(runner, 15)
        shown = await asyncio.to_thread(_cli, ["audit", "--json", "-c", str(path)], server, "operator", tmp_path)
        bad = await asyncio.to_thread(_cli, ["pause", "not-a-workload", "-c", str(path)], server, "operator",
                                      tmp_path)
    assert shown.returncode == 0, shown.stderr
    records = [json.loads(line) for line in shown.stdout.splitlines()]
    cordon = next(r for r in records if r["kind"] == "request" and r["action_type"] == "cordon")
    assert cordon["facts"]["requested_by"] and cordon["facts"]["node"]["name"] == node
    resumed = next(r for r in records if r["kind"] == "action" and r["action_type"] == "resume")
    assert "gpuevents.io/paused annotation" in resumed["detail"]
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "namespace/Kind/name" in bad.stderr
