"""`gpuevents free` against a running engine on a real nats-server: what it offers, prints and exits with."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import orjson

from gpuevents.bus import Bus
from gpuevents.clock import SystemClock
from gpuevents.config import Config
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, make_event
from rules.engine.service import Engine
from tests.gpuevents.cli.test_client import gpuevents, write_config
from tests.rules.engine.helpers import running
from tests.waiting import wait_for


def _publish_fleet(bus: Bus) -> None:
    now = SystemClock().now()

    def g(node: str, index: int, idle_min: float | None, **kw: object) -> GpuInfo:
        idle = idle_min is not None
        since = now - timedelta(minutes=idle_min) if idle_min is not None else None
        return GpuInfo(node=node, index=index, uuid=f"GPU-{node}-{index}", model="NVIDIA H100 80GB HBM3",
                       util_pct=0 if idle else 95, mem_used_mib=0, mem_total_mib=81559, idle=idle,
                       idle_since=since, **kw)

    gpus = [g("n1", 0, 300, pids=[4242]),  # held idle by alice: the most idle, never offered
            g("n1", 1, 30), g("n1", 2, None), g("n1", 3, 600, allocated=True, job="812345"), g("n1", 4, 120)]
    alice = ProcessInfo(node="n1", pid=4242, name="python", user="alice", create_time=now - timedelta(hours=6),
                        gpus=[0])
    snaps = [NodeSnapshot(node=NodeInfo(name="n1", cluster="c1", gpu_count=5), gpus=gpus, processes=[alice]),
             NodeSnapshot(node=NodeInfo(name="n2", cluster="c1", gpu_count=1, cordoned=True),
                          gpus=[g("n2", 0, 900)])]
    for s in snaps:
        bus.publish_event(make_event("node.snapshot", s.node.name, s, cluster="c1", time=now))


async def test_free_offers_the_idle_unheld_gpus_most_idle_first(engine_config: Config, bus: Bus,
                                                                 tmp_path: Path) -> None:
    cfg_file = write_config(engine_config, tmp_path / "config.yaml")
    _publish_fleet(bus)
    assert await bus.flush(5)
    async with running(await Engine.open(engine_config, bus, clock=SystemClock())) as engine:
        await wait_for(lambda: len(engine.core.state.nodes) == 2, what="both nodes")

        code, out = await gpuevents("free", "--json", "-c", str(cfg_file))
        assert code == 0, out
        answer = orjson.loads(out)
        assert [(n["node"], [g["index"] for g in n["gpus"]]) for n in answer["nodes"]] == [("n1", [4, 1])]
        assert answer["nodes"][0]["env"] == "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=4,1"
        assert answer["excluded"] == {"cordoned": 1, "allocated": 1, "held": 1, "busy": 1}

        code, out = await gpuevents("free", "-c", str(cfg_file))
        assert code == 0, out
        assert "n1: CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=4,1" in out
        assert "1 held by a process" in out and "1 allocated by a scheduler" in out

        code, out = await gpuevents("free", "--count", "3", "-c", str(cfg_file))
        assert code == 1
        assert "No GPU is free 3 on one node that matches" in out

        code, out = await gpuevents("free", "--min-free-mem", "lots", "-c", str(cfg_file))
        assert code == 2 and "--min-free-mem must be a size like 40G" in out


async def test_free_without_an_engine_says_so(engine_config: Config, bus: Bus, tmp_path: Path) -> None:
    code, out = await gpuevents("free", "-c", str(write_config(engine_config, tmp_path / "c.yaml")))
    assert code == 1
    assert "no engine answers" in out
