"""A site cut off from the hub, as the engine tells it (DESIGN §9): on a hub with two leaf sites whose link runs
through a relay, the engine shows site-a cut off as a site, holds a remedy for it (its readings may be stale),
and decides again once the site is back; site-b is decided as ever."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import orjson
import pytest
from msgspec.structs import replace

from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.clock import SystemClock
from gpuevents.config import Config
from gpuevents.events import SnapshotEvent, make_event
from gpuevents.wire.manual import OperatorAction, OperatorActionReply
from gpuevents.wire.status import StatusSummary
from rules.engine.service import Engine
from rules.engine.sites import SiteWatch
from tests.gpuevents.cli.test_client import gpuevents
from tests.nats_sites import Sites, start_sites, wait_linked
from tests.rules.engine.conftest import snapshot
from tests.rules.engine.helpers import running
from tests.waiting import wait_for


@pytest.fixture
async def sites(tmp_path: Path) -> AsyncIterator[Sites]:
    s = await start_sites(tmp_path / "sites")
    try:
        yield s
    finally:
        s.stop()
        await s.relay.stop()


def site_snapshot(cluster: str) -> SnapshotEvent:
    at = SystemClock().now()
    one = snapshot("gpu-0", at, util=90)
    data = replace(one.data, node=replace(one.data.node, cluster=cluster))
    event = make_event("node.snapshot", "gpu-0", data, cluster=cluster, time=at)
    assert isinstance(event, SnapshotEvent)
    return event


async def kill(bus: Bus, cluster: str) -> OperatorActionReply:
    req = OperatorAction(type="kill", cluster=cluster, node="gpu-0", pid=4242, by="test", reason="test")
    return OperatorActionReply.model_validate_json(await bus.request(S.ENGINE_ACT, req.model_dump_json().encode(),
                                                                     10))


async def test_a_cut_off_site_is_shown_as_a_site_and_no_remedy_is_decided_for_it(
    sites: Sites, rules_dir: Path, tmp_path: Path
) -> None:
    config = Config.model_validate({
        "cluster": "hub",
        "nats": {"url": sites.hub.url, "connect_timeout": 2, "publish_timeout": 2, "reconnect_wait": 0.2,
                 "sites": [{"cluster": s, "jetstream_domain": s} for s in ("site-a", "site-b")]},
        "engine": {"rules": [str(rules_dir)], "tick": "30s", "usage_db": str(tmp_path / "usage.sqlite"),
                   "dry_run": True},
        "agent": {"snapshot_interval": "1h"},
    })
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(orjson.dumps(config.model_dump(mode="json", include={"cluster", "nats"})).decode())
    bus = Bus(config.nats, name="engine", role="engine")
    await bus.connect()
    await bus.ensure_streams(cluster="hub")
    for site in ("site-a", "site-b"):
        agent = Bus(config.nats.model_copy(update={"url": sites.leaves[site].url, "sites": []}), role="agent",
                    node="gpu-0", cluster=site)
        await agent.connect()
        agent.publish_event(site_snapshot(site))
        assert await agent.flush(10)
        await agent.close()
    stop = asyncio.Event()
    watch = asyncio.create_task(SiteWatch(bus, SystemClock(), interval=0.2, cut_off_s=3).run(stop))
    try:
        async with running(await Engine.open(config, bus, clock=SystemClock())) as engine:
            await wait_for(lambda: len(engine.core.state.nodes) == 2, 20,
                           what="both sites' nodes")
            await wait_for(lambda: bus.site_state and not bus.sites_cut_off, 20, 0.1, what="both sites linked")
            assert (await kill(bus, "site-a")).decision == "dry_run"

            sites.relay.cut()
            await wait_for(lambda: "site-a" in bus.sites_cut_off, 20, 0.1, what="site-a seen cut off")
            held = await kill(bus, "site-a")
            assert held.decision == "held" and "site site-a is cut off" in (held.reason or "")
            assert (await kill(bus, "site-b")).decision == "dry_run"  # the other site as ever
            undo = OperatorAction(type="uncordon", cluster="site-a", node="gpu-0", by="test", reason="test")
            undone = OperatorActionReply.model_validate_json(
                await bus.request(S.ENGINE_ACT, undo.model_dump_json().encode(), 10))
            assert undone.decision == "dry_run"  # an undo reads no readings: not held
            code, out = await gpuevents("status", "--json", "-c", str(cfg_file))
            assert code == 0, out
            st = StatusSummary.model_validate_json(out)
            assert [(v.cluster, v.linked, v.nodes) for v in st.sites] == [("site-a", False, 1), ("site-b", True, 1)]
            code, out = await gpuevents("status", "-c", str(cfg_file))
            assert "SITE site-a CUT OFF from the hub" in " ".join(out.split()) and "site-b" not in out.split("\n")[0]

            sites.relay.restore()
            await wait_linked(sites, 30)
            await wait_for(lambda: "site-a" not in bus.sites_cut_off, 30, 0.1, what="site-a linked again")
            assert (await kill(bus, "site-a")).decision == "dry_run"
            assert timedelta(0) <= SystemClock().now() - st.summary.time < timedelta(minutes=5)
    finally:
        stop.set()
        await watch
        await bus.close()
