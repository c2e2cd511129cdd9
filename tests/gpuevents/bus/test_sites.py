"""Several sites on one hub (DESIGN §9): a hub and two leaf nats-servers with JetStream domains of their own;
the engine's stream setup makes each site's store and sources it into the hub's stream. What a site's agent
had acknowledged reaches the hub after its link was cut, after the agent restarted and after the leaf server
restarted; every event is stored once at its own site and once at the hub."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.js import api

from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.bus.streams import SiteLink
from gpuevents.config import NatsConfig
from gpuevents.config.sites import SiteConfig
from gpuevents.events import AgentInfo, Event, make_event
from tests.nats_sites import Sites, start_sites, wait_linked
from tests.waiting import wait_for

CUT_SEEN_S = 3.0  # the hub's source heartbeats about every second: past this, the site is cut off


def nats_config(url: str, **kw: object) -> NatsConfig:
    return NatsConfig(url=url, connect_timeout=2, publish_timeout=2, reconnect_wait=0.2, **kw)


HUB_SITES = [SiteConfig(cluster="site-a", jetstream_domain="site-a"),
             SiteConfig(cluster="site-b", jetstream_domain="site-b")]


@pytest.fixture
async def sites(tmp_path: Path) -> AsyncIterator[Sites]:
    s = await start_sites(tmp_path / "sites")
    try:
        yield s
    finally:
        s.stop()
        await s.relay.stop()


@pytest.fixture
async def engine(sites: Sites) -> AsyncIterator[Bus]:
    """The engine's bus on the hub, with the streams set up (its own and the sites' stores)."""
    bus = Bus(nats_config(sites.hub.url, sites=HUB_SITES), name="engine", role="engine")
    await bus.connect()
    await bus.ensure_streams(cluster="hub")
    assert bus.sites_not_set_up == []
    try:
        yield bus
    finally:
        await bus.close(flush_timeout=1)


async def agent_bus(sites: Sites, site: str) -> Bus:
    bus = Bus(nats_config(sites.leaves[site].url), name=f"agent-{site}", role="agent", node="gpu-0", cluster=site)
    await bus.connect()
    return bus


def event(site: str, n: int) -> Event:
    return make_event("agent.started", "gpu-0", AgentInfo(node="gpu-0", version=str(n)), cluster=site)


async def publish(bus: Bus, events: list[Event]) -> None:
    for e in events:
        bus.publish_event(e)
    assert await bus.flush(10), "the site's store did not acknowledge every event"


async def ids_at(bus: Bus, stream: str, subject: str = S.EVENTS_ALL) -> list[str]:
    return [json.loads(m.data)["id"] async for m in bus.replay(stream, subject)]


async def test_a_cut_off_site_keeps_what_it_acknowledged_and_the_hub_gets_all_of_it(sites: Sites,
                                                                                    engine: Bus) -> None:
    a, b = await agent_bus(sites, "site-a"), await agent_bus(sites, "site-b")
    sent_a, sent_b = [event("site-a", 0)], [event("site-b", 0)]
    await publish(a, sent_a)
    await publish(b, sent_b)
    hub_events = S.cluster_events_filter("site-a")
    await wait_for(lambda: ids_at(engine, S.STREAM_EVENTS, hub_events), what="site-a's first event at the hub")

    sites.relay.cut()

    async def cut_seen() -> bool:
        link = next(x for x in await engine.site_links() if x.cluster == "site-a")
        return link.active_s is None or link.active_s > CUT_SEEN_S
    await wait_for(cut_seen, 15, 0.2, what="the hub to see site-a cut off")
    during = [event("site-a", i) for i in range(1, 11)]
    await publish(a, during)  # acknowledged by site-a's own store, the hub out of reach
    await a.close()  # the agent restarts
    a = await agent_bus(sites, "site-a")
    after_restart = [event("site-a", i) for i in range(11, 16)]
    await publish(a, after_restart)
    await a.close()
    sites.leaves["site-a"].stop()  # the leaf server restarts, its store on disk
    sites.leaves["site-a"].start()
    a = await agent_bus(sites, "site-a")
    after_leaf = [event("site-a", i) for i in range(16, 21)]
    await publish(a, after_leaf)
    assert await ids_at(engine, S.STREAM_EVENTS, hub_events) == [sent_a[0].id]  # nothing came round the relay

    sites.relay.restore()
    await wait_linked(sites, 30)
    every = [e.id for e in sent_a + during + after_restart + after_leaf]
    got = await wait_for(lambda: _when(ids_at(engine, S.STREAM_EVENTS, hub_events), len(every)), 30, 0.2,
                         what="site-a's events at the hub")
    assert sorted(got) == sorted(every)  # all of them, each once
    assert await ids_at(engine, S.STREAM_EVENTS, S.cluster_events_filter("site-b")) == [sent_b[0].id]
    # each site's store holds its own events only
    assert sorted(await ids_at(a, S.STREAM_SITE)) == sorted(every)
    assert await ids_at(b, S.STREAM_SITE) == [sent_b[0].id]
    link = await wait_for(lambda: _linked(engine, "site-a"), 15, 0.2, what="site-a linked again")
    assert link.lag == 0
    await a.close()
    await b.close()


async def _when(ids: object, count: int) -> list[str] | None:
    got: list[str] = await ids  # type: ignore[misc]
    return got if len(got) >= count else None


async def _linked(bus: Bus, cluster: str) -> SiteLink | None:
    link = next(x for x in await bus.site_links() if x.cluster == cluster)
    return link if link.active_s is not None and link.active_s < CUT_SEEN_S else None


async def test_stream_setup_keeps_sources_it_did_not_add(sites: Sites, engine: Bus) -> None:
    nc = await nats.connect(sites.hub.url)
    try:
        jsm = nc.jetstream()
        await jsm.add_stream(name="OTHER", subjects=["other.>"])
        info = await jsm.stream_info(S.STREAM_EVENTS)
        cfg = info.config
        cfg.sources = [*(cfg.sources or []), api.StreamSource(name="OTHER")]
        await jsm.update_stream(cfg)
        await engine.ensure_streams(cluster="hub")  # a restart of the engine
        names = sorted((s.name, s.external.api if s.external else "")
                       for s in (await jsm.stream_info(S.STREAM_EVENTS)).config.sources or [])
        assert names == [("GPUEVENTS_SITE", "$JS.site-a.API"), ("GPUEVENTS_SITE", "$JS.site-b.API"),
                         ("OTHER", "")]
        # the hub's own subjects leave the sites' events to their stores: none is stored twice
        assert (await jsm.stream_info(S.STREAM_EVENTS)).config.subjects == [S.cluster_events_filter("hub")]
    finally:
        await nc.close()


async def test_the_engine_works_in_the_hubs_own_domain_named(sites: Sites) -> None:
    """`nats.jetstream_domain: hub`: the streams, the KV bucket and history reads all go through `$JS.hub.API`."""
    bus = Bus(nats_config(sites.hub.url, jetstream_domain="hub", sites=HUB_SITES), name="engine", role="engine")
    await bus.connect()
    try:
        await bus.ensure_streams(cluster="hub")
        kv = await bus.kv()
        await kv.put("probe", b"1")
        entry = await kv.get("probe")
        assert entry is not None and entry.value == b"1"
        e = event("hub", 0)
        await bus.js_publish(S.event_subject("hub", "gpu-0", e.type), e.model_dump_json().encode(), msg_id=e.id)
        assert await ids_at(bus, S.STREAM_EVENTS) == [e.id]
        assert {x.cluster for x in await bus.site_links()} == {"site-a", "site-b"}
    finally:
        await bus.close(flush_timeout=1)


async def test_a_sites_events_are_stored_in_the_engines_partitions(sites: Sites) -> None:
    """With engine.partitions, a site's sourced events are stored under their partition as a hub's own are."""
    bus = Bus(nats_config(sites.hub.url, sites=HUB_SITES), name="engine", role="engine")
    await bus.connect()
    a = await agent_bus(sites, "site-a")
    try:
        await bus.ensure_streams(2, cluster="hub")
        await publish(a, [event("site-a", 0)])
        e = event("hub", 0)
        await bus.js_publish(S.event_subject("hub", "gpu-0", e.type), e.model_dump_json().encode(), msg_id=e.id)

        async def stored() -> list[str] | None:
            got = sorted([m.subject async for m in bus.replay(S.STREAM_EVENTS, S.EVENTS_ALL)])
            return got if len(got) == 2 else None
        assert await wait_for(stored, 15, 0.1, what="both events at the hub") == sorted(
            S.stored_event_subject(c, "gpu-0", "agent.started", S.node_partition(c, "gpu-0", 2))
            for c in ("hub", "site-a"))
    finally:
        await a.close()
        await bus.close(flush_timeout=1)


async def test_a_source_started_over_resumes_where_it_stopped(sites: Sites, engine: Bus) -> None:
    """What the engine does when a site answers again while the server's retries still wait: every event once."""
    a = await agent_bus(sites, "site-a")
    try:
        before = [event("site-a", i) for i in range(5)]
        await publish(a, before)
        hub_events = S.cluster_events_filter("site-a")
        await wait_for(lambda: _when(ids_at(engine, S.STREAM_EVENTS, hub_events), 5), 15, 0.1, what="5 at the hub")
        sites.relay.cut()
        await wait_for(lambda: _cut(engine, "site-a"), 15, 0.2, what="the hub to see site-a cut off")
        during = [event("site-a", i) for i in range(5, 10)]
        await publish(a, during)
        sites.relay.restore()
        await wait_linked(sites, 30)
        site = engine.config.site("site-a")
        assert site is not None and await engine.site_answers(site)
        await engine.restart_site_source(site)
        got = await wait_for(lambda: _when(ids_at(engine, S.STREAM_EVENTS, hub_events), 10), 15, 0.1,
                             what="all 10 at the hub")
        assert sorted(got) == sorted(e.id for e in before + during)
    finally:
        await a.close()


async def _cut(bus: Bus, cluster: str) -> bool:
    link = next(x for x in await bus.site_links() if x.cluster == cluster)
    return link.active_s is None or link.active_s > CUT_SEEN_S
