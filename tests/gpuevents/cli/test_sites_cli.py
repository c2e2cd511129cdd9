"""The command line names sites: two sites' nodes of one name in one engine, told apart by `--cluster` (kill,
snooze, keep) and by the `cluster` field of `status --json`."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import orjson
from msgspec.structs import replace

from gpuevents.bus import Bus
from gpuevents.clock import SystemClock
from gpuevents.config import Config
from gpuevents.events import SnapshotEvent, make_event
from rules.engine.service import Engine
from tests.gpuevents.cli.test_client import gpuevents, write_config
from tests.rules.engine.conftest import snapshot
from tests.rules.engine.helpers import audit_records, running
from tests.waiting import wait_for


def site_snapshot(cluster: str, node: str, at: datetime) -> SnapshotEvent:
    one = snapshot(node, at, idle_since=at)
    data = replace(one.data, node=replace(one.data.node, cluster=cluster))
    event = make_event("node.snapshot", node, data, cluster=cluster, time=at)
    assert isinstance(event, SnapshotEvent)
    return event


async def test_two_sites_nodes_of_one_name_are_named_by_cluster(engine_config: Config, bus: Bus,
                                                               tmp_path: Path) -> None:
    cfg = str(write_config(engine_config, tmp_path / "config.yaml"))  # cluster c1, the engine's own
    clock = SystemClock()
    start = clock.now() - timedelta(hours=2)
    for cluster in ("c1", "site-b"):
        bus.publish_event(site_snapshot(cluster, "n1", start))
    assert await bus.flush(5)
    async with running(await Engine.open(engine_config, bus, clock=clock)) as engine:
        await wait_for(lambda: len(engine.core.open_incidents()) == 2,
                       what="an incident per site")
        code, out = await gpuevents("status", "--all", "--json", "-c", cfg)
        assert code == 0, out
        incidents = [orjson.loads(line)["incident"] for line in out.splitlines() if '"incident"' in line]
        assert sorted((i["cluster"], i["entity_id"]) for i in incidents) == [("c1", "n1/gpu0"),
                                                                              ("site-b", "site-b:n1/gpu0")]

        code, out = await gpuevents("snooze", "idle-gpu-1h", "n1/gpu0", "--for", "4h", "--cluster", "site-b",
                                    "-c", cfg)
        assert code == 0, out
        assert [k for k in engine.core.snoozes] == [("idle-gpu-1h", "site-b:n1/gpu0")]
        code, out = await gpuevents("keep", "idle-gpu-1h", "n1/gpu0", "2h", "--reason", "eval", "-c", cfg)
        assert code == 0, out
        assert sorted(engine.core.snoozes) == [("idle-gpu-1h", "n1/gpu0"), ("idle-gpu-1h", "site-b:n1/gpu0")]

        code, out = await gpuevents("kill", "n1", "4242", "--cluster", "site-b", "--reason", "test", "-c", cfg)
        assert "kill of site-b:n1/" in out, out
        records = await audit_records(bus)
        assert [r.cluster for r in records if r.kind == "request" and r.action_type == "kill"] == ["site-b"]
        assert sorted((r.entity_id, r.cluster) for r in records if r.kind == "snooze") == [
            ("n1/gpu0", "c1"), ("site-b:n1/gpu0", "site-b")]
