"""A rule set that uses every built-in action type, run end to end: agent snapshot → engine → runner → the world.

Slack is the local API server of tests/actions/fakes.py reached through slack-sdk; Kubernetes is a real control
plane (tests/kube_cluster.py) reached through lightkube; kill goes to the agent's real kill handler and ends a
real child process.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime
from pathlib import Path

import orjson
import psutil
import pytest
from lightkube.models.apps_v1 import DeploymentSpec
from lightkube.models.core_v1 import Container, PodSpec, PodTemplateSpec
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Node

from actions.runner import ActionRunner
from agent.attribution import PsutilControl
from agent.kill import KillHandler, KillPolicy, RateLimit
from agent.sample import LiveProcess
from gpuevents import subjects as S
from gpuevents.bus import Bus, Message
from gpuevents.clock import SystemClock
from gpuevents.config import Config, NatsConfig, ProtectConfig
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, make_event
from gpuevents.records import AuditRecord, decode_audit
from rules.engine.service import Engine
from tests.actions.fakes import FakeSlack, FakeWebhook, SlackUser
from tests.kube_cluster import KubeCluster
from tests.waiting import wait_for

EVERY_ACTION = """\
rules:
  - name: idle-everything
    description: exercises every built-in action
    entity: gpu
    when: gpu.idle and gpu.processes
    actions:
      - {type: log, message: "GPU {{ gpu.index }} on {{ node.name }} idle"}
      - type: slack
        to: "{{ gpu.owner }}"
        text: "GPU {{ gpu.index }} idle, held by {{ gpu.processes | map(attribute='name') | join(', ') }}"
      - {type: webhook, url: "WEBHOOK_URL", body: {gpu: "{{ entity.id }}", owner: "{{ gpu.owner }}"}}
      - type: command
        argv: ["PYTHON", "-c", "import sys; open(sys.argv[1], 'w').write(sys.argv[2])", "COMMAND_OUT",
               "{{ entity.id }}"]
      - {type: publish, subject: gpuevents.custom.idle, data: {gpu: "{{ entity.id }}"}}
      - {type: function, name: notify, data: {why: idle}}
      - {type: cordon, provider: kubernetes, reason: "idle GPU {{ gpu.index }}"}
      - {type: scale, provider: kubernetes, kind: Deployment, namespace: NAMESPACE, name: web, replicas: 0}
      - {type: kill, signal: TERM, grace: 1s, reason: "idle ({{ rule.name }})"}
    on_resolve:
      - {type: uncordon, provider: kubernetes}
      - {type: scale, provider: kubernetes, kind: Deployment, namespace: NAMESPACE, name: web, replicas: previous}
"""


@pytest.fixture
async def servers() -> AsyncIterator[tuple[FakeSlack, FakeWebhook]]:
    slack = FakeSlack([SlackUser("U001", "alice", "alice@example.com", "Alice")])
    hook = FakeWebhook()
    for s in (slack, hook):
        await s.start()
    try:
        yield slack, hook
    finally:
        for s in (slack, hook):
            await s.close()


def gpu_snapshot(node: str, pid: int, created: datetime, util: float, at: datetime) -> NodeSnapshot:
    idle = util < 5
    gpu = GpuInfo(node=node, index=0, uuid="GPU-0", model="NVIDIA H100 80GB HBM3", util_pct=util,
                  mem_used_mib=20000, mem_total_mib=81559, idle=idle, idle_since=at if idle else None,
                  pids=[pid])
    proc = ProcessInfo(node=node, pid=pid, name="jupyter <!channel>", user="alice", create_time=created,
                       gpus=[0], gpu_mem_mib=20000)
    return NodeSnapshot(node=NodeInfo(name=node, cluster="c1", gpu_count=1), gpus=[gpu], processes=[proc])


async def test_a_rule_with_every_built_in_action_runs_end_to_end(
    nats_config: NatsConfig, bus: Bus, tmp_path: Path, servers: tuple[FakeSlack, FakeWebhook],
    kube_cluster: KubeCluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    slack, hook = servers
    n1 = kube_cluster.unique("n1")  # the GPU node: a real Node (kwok keeps it Ready)
    kube_cluster.add_gpu_node(n1)
    ns = kube_cluster.namespace("staging")
    kube = kube_cluster.sync_client()
    pods = PodTemplateSpec(metadata=ObjectMeta(labels={"app": "web"}),
                           spec=PodSpec(containers=[Container(name="web", image="web:1")]))
    kube.create(Deployment(metadata=ObjectMeta(name="web", namespace=ns), spec=DeploymentSpec(
        replicas=3, selector=LabelSelector(matchLabels={"app": "web"}), template=pods)))

    def unschedulable() -> bool:
        node = kube.get(Node, n1)
        return bool(node.spec and node.spec.unschedulable)

    def replicas() -> int | None:
        return kube.get(Deployment, "web", namespace=ns).spec.replicas

    out = tmp_path / "command.txt"
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "all.yaml").write_text(EVERY_ACTION.replace("WEBHOOK_URL", hook.url()).replace("NAMESPACE", ns)
                                    .replace("PYTHON", sys.executable).replace("COMMAND_OUT", str(out)))
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test")
    config = Config.model_validate({
        "cluster": "c1",
        "nats": nats_config.model_dump(),
        "engine": {"rules": [str(rules)], "usage_db": str(tmp_path / "usage.sqlite")},
        "actions": {"slack": {"base_url": slack.base_url},
                    "kubernetes": {"kubeconfig": str(kube_cluster.kubeconfig)},
                    "timeout": 10, "retry": {"max_attempts": 3, "backoff": 0.05, "backoff_max": 0.2}},
        "owners": {"alice": "alice@example.com"},
        "protect": {"users": []},
    })

    # the node's agent: its real kill handler; the child "holds a GPU"
    child = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(120)")
    created = datetime.fromtimestamp(psutil.Process(child.pid).create_time(), UTC)
    handler = KillHandler(control=PsutilControl(),
                          policy=KillPolicy(ProtectConfig(users=[]), agent_pid=os.getpid(), node_labels={}),
                          rate=RateLimit(100),
                          holds_gpu=lambda p: isinstance(p, LiveProcess) and p.pid == child.pid, poll_s=0.02)
    await bus.serve(S.command_subject("c1", n1, "kill"), handler.answer)

    published: list[dict[str, str]] = []

    async def on_custom(msg: Message) -> None:
        published.append(orjson.loads(msg.data))

    await bus.subscribe("gpuevents.custom.idle", on_custom)
    called: list[dict[str, object]] = []

    async def notify(msg: Message) -> bytes:
        called.append(orjson.loads(msg.data))
        return b'{"status": "ok", "detail": "noted"}'

    await bus.serve(S.function_subject("notify"), notify)

    clock = SystemClock()
    engine = await Engine.open(config, bus, clock=clock)
    runner = await ActionRunner.open(bus, config, clock)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(engine.run(stop)), asyncio.create_task(runner.run(stop))]
    try:
        await wait_for(lambda: engine.ready.is_set(), what="the engine to lead")
        bus.publish_event(make_event("node.snapshot", n1, gpu_snapshot(n1, child.pid, created, 0, clock.now()),
                                     cluster="c1"))

        async def outcomes() -> dict[str, AuditRecord]:
            recs = [r async for m in bus.replay(S.STREAM_AUDIT, S.AUDIT_ALL) for r in decode_audit(m.data)]
            return {r.action_type: r for r in recs
                    if r.kind == "action" and r.outcome is not None and r.action_type is not None}

        fired = {"log", "slack", "webhook", "command", "publish", "function", "cordon", "scale", "kill"}
        done = await wait_for(lambda: _has(outcomes(), fired), timeout=30, what="every action's outcome")
        assert {t: r.outcome for t, r in done.items() if t in fired} == dict.fromkeys(fired, "ok"), done

        dms = slack.dms_to("U001")
        assert len(dms) == 1 and "&lt;!channel&gt;" in dms[0]["text"] and "<!channel>" not in dms[0]["text"]
        assert orjson.loads(hook.requests[0]["body"]) == {"gpu": f"{n1}/gpu0", "owner": "alice@example.com"}
        assert out.read_text() == f"{n1}/gpu0"
        assert published == [{"gpu": f"{n1}/gpu0"}]
        assert called and called[0]["data"] == {"why": "idle"} and called[0]["entity_id"] == f"{n1}/gpu0"
        assert unschedulable() is True
        assert replicas() == 0
        assert await asyncio.wait_for(child.wait(), 10) is not None  # the real process ended

        # busy again: the incident resolves and on_resolve undoes the cordon and the scale-down
        bus.publish_event(make_event("node.snapshot", n1, gpu_snapshot(n1, child.pid, created, 90, clock.now()),
                                     cluster="c1"))
        await wait_for(lambda: not unschedulable(), timeout=30, what="uncordon on resolve")
        await wait_for(lambda: replicas() == 3, timeout=30, what="scale back to the previous count")
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await runner.close()
        if child.returncode is None:
            child.kill()
            await child.wait()


async def _has(pending: Awaitable[dict[str, AuditRecord]], wanted: set[str]) -> dict[str, AuditRecord] | None:
    got = await pending
    return got if wanted <= set(got) else None
