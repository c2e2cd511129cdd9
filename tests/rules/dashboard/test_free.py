"""`free_gpus`: which GPUs are offered, in which order, and never one that somebody holds; `GET /api/free`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpuevents.agentdata import GpuInfo, NodeInfo, NodeSnapshot
from gpuevents.wire.free import FreeAnswer, FreeQuery, parse_labels, parse_mem_mib
from rules.dashboard.fleet_view import FleetView, fleet_view
from rules.dashboard.free import free_gpus
from rules.dashboard.pages import make_dashboard_app

NOW = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
H100 = "NVIDIA H100 80GB HBM3"


def gpu(node: str, index: int, *, idle_for: float | None = 600.0, util: float = 0.0, used: float = 500.0,
        model: str = H100, total: float = 81559, **kw: Any) -> GpuInfo:
    idle = idle_for is not None
    return GpuInfo(node=node, index=index, uuid=f"GPU-{node}-{index}", model=model, util_pct=util if idle else 90.0,
                   mem_used_mib=used, mem_total_mib=total, idle=idle, idle_for_s=idle_for, **kw)


def node(name: str, gpus: list[GpuInfo], *, online: bool = True, cordoned: bool | None = None,
         labels: dict[str, str] | None = None) -> NodeSnapshot:
    return NodeSnapshot(node=NodeInfo(name=name, online=online, cordoned=cordoned, labels=labels or {},
                                      gpu_count=len(gpus)), gpus=gpus)


def fleet(*snaps: NodeSnapshot) -> FleetView:
    return fleet_view(snaps, NOW)


def offered(answer: FreeAnswer) -> list[str]:
    return [f"{n.node}/{g.index}" for n in answer.nodes for g in n.gpus]


def test_never_offers_a_held_allocated_busy_lost_offline_or_cordoned_gpu() -> None:
    f = fleet(
        node("a", [gpu("a", 0), gpu("a", 1, pids=[7]), gpu("a", 2, owners=["bob"]), gpu("a", 3, allocated=True,
                                                                                       job="4242"),
                   gpu("a", 4, idle_for=None), gpu("a", 5, lost=True), gpu("a", 6, allocated=False)]),
        node("b", [gpu("b", 0)], online=False),
        node("c", [gpu("c", 0)], cordoned=True),
    )
    answer = free_gpus(f, FreeQuery())
    assert offered(answer) == ["a/0", "a/6"]
    assert answer.excluded == {"offline": 1, "cordoned": 1, "lost": 1, "allocated": 1, "held": 2, "busy": 1}
    assert answer.free_gpus == 2


def test_most_idle_first_within_a_node_and_across_nodes() -> None:
    f = fleet(
        node("a", [gpu("a", 0, idle_for=60), gpu("a", 1, idle_for=7200), gpu("a", 2, idle_for=7200, util=3)]),
        node("b", [gpu("b", 0, idle_for=86400)]),
    )
    answer = free_gpus(f, FreeQuery())
    assert [n.node for n in answer.nodes] == ["b", "a"]
    assert offered(answer) == ["b/0", "a/1", "a/2", "a/0"]
    assert answer.nodes[1].env == "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1,2,0"


def test_count_wants_that_many_gpus_on_one_node() -> None:
    f = fleet(
        node("a", [gpu("a", 0, idle_for=99999)]),  # the most idle GPU, but alone on its node
        node("b", [gpu("b", i, idle_for=100 * (i + 1)) for i in range(4)]),
        node("c", [gpu("c", i, idle_for=5000) for i in range(2)] + [gpu("c", 2, pids=[1])]),
    )
    answer = free_gpus(f, FreeQuery(count=2))
    assert [(n.node, n.cuda_visible_devices) for n in answer.nodes] == [("c", "0,1"), ("b", "3,2")]
    assert free_gpus(f, FreeQuery(count=5)).nodes == []


def test_filters_by_free_memory_model_labels_and_cluster() -> None:
    f = fleet(
        node("a", [gpu("a", 0, used=60000), gpu("a", 1, used=1000),
                   gpu("a", 2, model="NVIDIA A100-SXM4-40GB", total=40960)], labels={"team": "vision", "pool": "x"}),
        node("b", [gpu("b", 0)], labels={"team": "nlp"}),
    )
    # equally idle: the one with the most memory free first
    assert offered(free_gpus(f, FreeQuery(min_free_mem_mib=parse_mem_mib("40G")))) == ["b/0", "a/1"]
    assert offered(free_gpus(f, FreeQuery(model="a100"))) == ["a/2"]
    assert offered(free_gpus(f, FreeQuery(labels=parse_labels(["team=nlp"])))) == ["b/0"]
    assert offered(free_gpus(f, FreeQuery(labels=parse_labels(["pool"])))) == ["a/1", "a/2", "a/0"]
    assert offered(free_gpus(f, FreeQuery(cluster="other"))) == []
    assert free_gpus(f, FreeQuery(model="a100")).excluded == {"filtered": 3}


def test_a_mig_instance_is_named_by_its_uuid() -> None:
    parent = GpuInfo(node="m", index=0, uuid="GPU-parent", model=H100, idle=True, mem_total_mib=81559)
    inst = GpuInfo(node="m", index=1, uuid="MIG-abc", mig_parent="GPU-parent", model=H100, idle=True,
                   idle_for_s=50, mem_used_mib=0, mem_total_mib=9984)
    answer = free_gpus(fleet(node("m", [parent, inst])), FreeQuery())
    assert answer.nodes[0].cuda_visible_devices == "MIG-abc"


class _Source:
    def __init__(self, view: FleetView) -> None:
        self.view = view

    def fleet(self) -> FleetView:
        return self.view

    def incidents(self) -> list[object]:
        return []

    def recent_audit(self, limit: int) -> list[object]:
        return []


async def test_api_free_answers_as_the_function_does() -> None:
    f = fleet(node("a", [gpu("a", 0, idle_for=10), gpu("a", 1, idle_for=20, pids=[3]), gpu("a", 2, idle_for=30)],
                   labels={"team": "vision"}),
              node("b", [gpu("b", 0, idle_for=40)], labels={"team": "nlp"}))
    async with TestClient(TestServer(make_dashboard_app(_Source(f)))) as c:  # type: ignore[arg-type]  # a minimal FleetSource
        r = await c.get("/api/free?count=2&min_free_mem=40G&model=H100&label=team=vision")
        assert r.status == 200
        body = FreeAnswer.model_validate(await r.json())
        assert body == free_gpus(f, FreeQuery(count=2, min_free_mem_mib=40960, model="H100",
                                              labels={"team": "vision"}))
        assert [(n.node, n.cuda_visible_devices) for n in body.nodes] == [("a", "2,0")]
        for bad, says in (("count=0", "count must be a whole number from 1"), ("min_free_mem=lots", "min_free_mem"),
                          ("label==x", "label must be KEY=VALUE")):
            r = await c.get(f"/api/free?{bad}")
            assert r.status == 400 and says in await r.text()


@pytest.mark.parametrize("query", [FreeQuery(), FreeQuery(count=2), FreeQuery(limit=2), FreeQuery(model="H100")])
def test_answers_of_partitions_merge_into_the_answer_for_the_whole_fleet(query: FreeQuery) -> None:
    # engines that each act for part of the fleet answer for their part; the CLI merges (a reply stays small)
    a = [node("a", [gpu("a", 0, idle_for=100), gpu("a", 1, idle_for=900), gpu("a", 2, pids=[1])]),
         node("c", [gpu("c", 0, idle_for=50, model="NVIDIA A100")])]
    b = [node("b", [gpu("b", 0, idle_for=700), gpu("b", 1, idle_for=800)]),
         node("d", [gpu("d", 0)], online=False)]
    from gpuevents.wire.free import merge_answers

    merged = merge_answers([free_gpus(fleet(*a), query), free_gpus(fleet(*b), query)], query)
    whole = free_gpus(fleet(*a, *b), query)
    assert offered(merged) == offered(whole) and merged.free_gpus == whole.free_gpus
    assert merged.excluded == whole.excluded
