"""The agent reads its own Kubernetes Node: labels under the configured ones, `cordoned` from
spec.unschedulable, protection by node label, failures that keep what was known. Against a real control
plane (tests/kube_cluster.py); the API server's 500, which a real one does not answer on demand, against the
stand-in."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
from lightkube.resources.core_v1 import Node

from agent import kubenode
from agent.kubenode import KubeNodeInfo, NodeLookup
from agent.metrics import AgentCounters
from agent.runner import NodeAgent, run_nodes, simulated_agents
from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.clock import SystemClock
from gpuevents.commands import KillCommand, KillReply
from gpuevents.config import AgentConfig, Config, NatsConfig, ProtectConfig
from gpuevents.events import SnapshotEvent, decode_event
from tests.actions.conftest import kube, kubeconfig  # noqa: F401  (fixtures)
from tests.actions.fakes import FakeKubernetes, Injected
from tests.kube_cluster import KubeCluster
from tests.waiting import wait_for

NODE = "sim-000"
K8S_LABELS = {"env": "from-kubernetes", "topology.kubernetes.io/zone": "z1", "nvidia.com/gpu.product": "A100"}


def config(kubeconfig_path: Path, nats: NatsConfig | None = None, **protect: object) -> Config:
    return Config.model_validate({
        "cluster": "c1", **({"nats": nats.model_dump()} if nats else {}),
        "agent": AgentConfig(node_name=NODE, sample_interval=0.1, snapshot_interval=0.2,
                             labels={"pool": "a100", "env": "from-config"}, kubernetes_node=True).model_dump(),
        "actions": {"kubernetes": {"kubeconfig": str(kubeconfig_path)}},
        "protect": ProtectConfig(users=[], **protect).model_dump(),
    })


def add_node(kube: FakeKubernetes, cordoned: bool = False) -> None:  # noqa: F811
    kube.add_node(NODE, unschedulable=cordoned)
    kube.nodes[NODE]["metadata"]["labels"] = dict(K8S_LABELS)


def add_real_node(cluster: KubeCluster, cordoned: bool = False) -> str:
    """A node of the real API server with K8S_LABELS; its name (the agent looks it up by that name)."""
    name = cluster.unique("gpu")
    cluster.add_gpu_node(name, labels=K8S_LABELS, unschedulable=cordoned)
    return name


def agent_of(cfg: Config) -> NodeAgent:
    (agent,) = simulated_agents(cfg, nodes=1, gpus_per_node=2, scenario="demo", start=datetime.now(UTC))
    return agent


async def test_node_labels_merge_under_the_config_and_cordon_comes_from_the_spec(
        kube_cluster: KubeCluster) -> None:
    name = add_real_node(kube_cluster, cordoned=True)
    cfg = config(kube_cluster.kubeconfig)
    agent = agent_of(cfg)
    lookup = NodeLookup(cfg, name)
    try:
        state = await lookup.refresh()
    finally:
        await lookup.close()
    node_labels = {**K8S_LABELS, "kubernetes.io/hostname": name, "type": "kwok"}  # as the node was created
    assert state == KubeNodeInfo(labels=node_labels, cordoned=True)
    agent.apply_kubernetes_node(state)
    agent.tick(datetime.now(UTC))  # the core learns it at the next sample
    info = agent.core.node_info()
    assert info.labels == {**node_labels, "env": "from-config", "pool": "a100"}
    assert info.cordoned is True


async def test_a_kubernetes_label_can_protect_the_node_from_kills(kube_cluster: KubeCluster) -> None:
    name = add_real_node(kube_cluster)
    cfg = config(kube_cluster.kubeconfig, node_labels={"topology.kubernetes.io/zone": "z1"})
    agent = agent_of(cfg)
    assert not agent.kill.policy.node_protected
    lookup = NodeLookup(cfg, name)
    state = await lookup.refresh()
    await lookup.close()
    assert state is not None
    agent.apply_kubernetes_node(state)
    reply = await agent.kill.handle(KillCommand(pid=4242, create_time=datetime.now(UTC)))
    assert (reply.outcome, reply.reason) == ("refused", "this node is protected (protect.node_labels)")


async def test_a_failed_read_keeps_what_was_known_and_says_what_rbac_is_missing(
        kube: FakeKubernetes, kubeconfig: Path, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    add_node(kube, cordoned=True)
    lookup = NodeLookup(config(kubeconfig), NODE)
    first = await lookup.refresh()
    kube.inject += [Injected(403), Injected(403), Injected(500)]
    with caplog.at_level(logging.WARNING, logger="agent.kubenode"):
        assert await lookup.refresh() == first
        assert await lookup.refresh() == first
        assert await lookup.refresh() == first
    await lookup.close()
    assert lookup.errors == 3
    warnings = [m for m in caplog.messages if m.startswith("cannot read kubernetes node")]
    assert len(warnings) == 2  # the 403 once, then the 500
    assert "needs `get` on nodes" in warnings[0] and "(HTTP 403)" in warnings[0]
    assert "(HTTP 500)" in warnings[1]


async def test_without_rbac_the_read_fails_with_403_and_says_what_is_missing(
        kube_cluster: KubeCluster, caplog: pytest.LogCaptureFixture) -> None:
    name = add_real_node(kube_cluster)
    ns = kube_cluster.namespace("agent")
    no_rights = kube_cluster.service_account_kubeconfig(ns, "agent-without-rbac")
    lookup = NodeLookup(config(no_rights), name)
    with caplog.at_level(logging.WARNING, logger="agent.kubenode"):
        assert await lookup.refresh() is None
    await lookup.close()
    assert lookup.errors == 1
    (warning,) = [m for m in caplog.messages if m.startswith("cannot read kubernetes node")]
    assert f'nodes "{name}" is forbidden' in warning and "(HTTP 403)" in warning
    assert "needs `get` on nodes" in warning


async def test_a_missing_node_leaves_the_state_unknown(kube_cluster: KubeCluster) -> None:
    lookup = NodeLookup(config(kube_cluster.kubeconfig), "no-such-node")
    assert await lookup.refresh() is None
    await lookup.close()
    assert lookup.errors == 1


def test_unset_means_on_in_a_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = Config(agent=AgentConfig(node_name="n1"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert not kubenode.wanted(cfg)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert kubenode.wanted(cfg)
    off = Config(agent=AgentConfig(node_name="n1", kubernetes_node=False))
    assert not kubenode.wanted(off)


async def test_the_running_agent_publishes_the_node_labels_and_follows_an_uncordon(
        bus: Bus, nats_config: NatsConfig, kube_cluster: KubeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kubenode, "REFRESH_S", 0.05)
    name = add_real_node(kube_cluster, cordoned=True)
    cfg = config(kube_cluster.kubeconfig, nats_config)
    agent = agent_of(cfg)
    stop = asyncio.Event()
    counters = AgentCounters()
    task = asyncio.create_task(run_nodes([agent], bus, config=cfg, clock=SystemClock(), stop=stop,
                                         counters=counters, nodes={NODE: NodeLookup(cfg, name)}))

    async def latest_node() -> dict[str, object] | None:
        snaps = [e for m in [m async for m in bus.replay(S.STREAM_EVENTS, S.EVENTS_ALL)]
                 if isinstance(e := decode_event(m.data), SnapshotEvent)]
        return msgspec.to_builtins(snaps[-1].data.node, builtin_types=(datetime,)) if snaps else None

    async def cordoned(value: bool) -> bool:
        node = await latest_node()
        return node is not None and node["cordoned"] is value and \
            node["labels"].get("topology.kubernetes.io/zone") == "z1"  # type: ignore[attr-defined]  # JSON: labels is a dict

    try:
        await wait_for(lambda: cordoned(True), timeout=10, what="a snapshot of the cordoned node")
        kube_cluster.sync_client().patch(Node, name, {"spec": {"unschedulable": False}})  # a person uncordons
        await wait_for(lambda: cordoned(False), timeout=10, what="a snapshot after the uncordon")
        reply = await bus.request(S.command_subject("c1", NODE, "kill"), KillCommand(
            pid=999_999, create_time=datetime.now(UTC)).model_dump_json().encode(), timeout=5)
        assert KillReply.model_validate_json(reply).outcome == "gone"  # the kill service runs alongside
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert counters.restarts == {}
