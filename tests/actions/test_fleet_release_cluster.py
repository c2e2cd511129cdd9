"""The walk's case on a real control plane: six of six idle workloads in a small namespace for hours. The pruner's
max_fleet_pct holds them, asks the platform channel once for the outbreak, and one release there ends with all
six paused."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from lightkube import Client, codecs
from lightkube.resources.apps_v1 import Deployment

from actions import approvals
from actions.runner import ActionRunner
from actions.store import MemoryKv
from gpuevents.config import Config
from gpuevents.events import GpuInfo, JobInfo, NodeInfo, NodeSnapshot, SnapshotEvent
from gpuevents.records import ActionRequest
from rules.core.core import Core
from tests.actions.conftest import make_config
from tests.actions.fakes import FakeSlack
from tests.actions.test_evidence_cluster import deployment, running_pods
from tests.kube_cluster import KubeCluster
from tests.rules.helpers import rules_from
from tests.waiting import wait_for

PRUNER = """\
rules:
  - name: pruner
    entity: job
    when: job.scheduler == 'kubernetes' and job.idle
    for: 2h
    limits: {max_fleet_pct: 50}
    actions:
      - {type: pause}
"""


@pytest.fixture
def api(kube_cluster: KubeCluster) -> Iterator[Client]:
    with contextlib.closing(kube_cluster.sync_client()) as c:
        yield c


def decided(tmp_path: Path, node: str, ns: str, n: int) -> list[ActionRequest]:
    """What the engine decides over three hours of `n` idle workloads on `node`, ending now."""
    holds = Config.model_validate({"engine": {"holds": {"channel": "#gpu-platform"}}})
    core = Core(rules_from(tmp_path, PRUNER), holds)
    start = datetime.now(UTC) - timedelta(hours=3)
    out: list[ActionRequest] = []
    for step in range(0, 3 * 60 + 1, 10):
        t = start + timedelta(minutes=step)
        gpus = [GpuInfo(node=node, index=i, util_pct=0, idle=True, idle_since=start) for i in range(n)]
        jobs = [JobInfo(id=f"{ns}/Deployment/w{i}", scheduler="kubernetes", namespace=ns, gpus=[i]) for i in range(n)]
        out += core.step(SnapshotEvent(source=f"node/{node}", time=t, data=NodeSnapshot(
            node=NodeInfo(name=node), gpus=gpus, jobs=jobs)), t).actions
    return out


async def test_six_of_six_idle_are_held_asked_once_and_reclaimed_on_release(
        kube_cluster: KubeCluster, api: Client, slack: FakeSlack, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test")
    node = kube_cluster.unique("gpu")
    kube_cluster.add_gpu_node(node)
    ns = kube_cluster.namespace("small")
    for i in range(6):
        api.create(codecs.from_dict(deployment(ns, f"w{i}", 1, node)))
    kube_cluster.wait(lambda: running_pods(api, ns, 6), 60, "six pods running")
    requests = decided(tmp_path, node, ns, 6)
    assert len(requests) == 6 and {r.approval_key for r in requests} != {None}
    kv = MemoryKv()
    runner = await ActionRunner.open(
        None, make_config(actions={"kubernetes": {"kubeconfig": str(kube_cluster.kubeconfig)},
                          "slack": {"base_url": slack.base_url}}), kv=kv)
    started = time.monotonic()
    tasks = [asyncio.create_task(runner.process(r)) for r in requests]
    try:
        await wait_for(lambda: slack.posted, timeout=30, what="the question to the platform channel")
        assert all(api.get(Deployment, f"w{i}", namespace=ns).spec.replicas == 1 for i in range(6))  # held
        [post] = slack.posted
        key = next(b for b in post["blocks"] if b["type"] == "actions")["elements"][0]["value"]
        released = await approvals.decide(kv, key, True, "U003", datetime.now(UTC))
        assert released is not None and released.status == "approved"
        records = await asyncio.wait_for(asyncio.gather(*tasks), 120)
    finally:
        for t in tasks:
            t.cancel()
        await runner.close()
    print(f"\n6 of 6 held, 1 question to {post['channel']}, released: "
          f"{[r.outcome for r in records].count('ok')} paused in {time.monotonic() - started:.1f}s")
    assert post["channel"] == "#gpu-platform" and len(slack.posted) == 1
    assert "6 of 6 jobs (100.0%) match pruner, over max_fleet_pct 50%" in post["text"]
    assert [r.outcome for r in records] == ["ok"] * 6, records
    assert [api.get(Deployment, f"w{i}", namespace=ns).spec.replicas for i in range(6)] == [0] * 6
