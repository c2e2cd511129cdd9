"""The logins deploy/nats/nats_auth.py writes for several sites, on real nats-servers: a hub and two leaf sites
with JetStream domains, each leaf linked to the hub as its own `leaf/<site>` login. A site's logins reach its
own subjects only, across the leaf link too: site-a can neither publish for site-b nor hear site-b's commands,
while the engine sets up both sites' stores through the restricted links and their events reach the hub."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from nats.aio.msg import Msg

from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.config import NatsConfig
from gpuevents.config.sites import SiteConfig
from gpuevents.events import AgentInfo, make_event
from gpuevents.server import free_port
from tests.deploy.test_nats_permissions import collect, connect
from tests.nats_sites import Server, Sites, leaf_links, start_sites
from tests.waiting import wait_for


@dataclass(frozen=True)
class At:
    url: str


@dataclass
class Generated:
    sites: Sites
    out: Path
    result: object

    def agent(self, site: str, node: str = "gpu-0") -> tuple[str, str]:
        return f"agent/{site}/{node}", self.result.sites[site].agents[node]  # type: ignore[attr-defined]

    def role(self, role: str) -> tuple[str, str]:
        return f"gpuevents-{role}", self.result.role_passwords[role]  # type: ignore[attr-defined]


@pytest.fixture
async def generated(tmp_path: Path, nats_auth: ModuleType) -> AsyncIterator[Generated]:
    out = tmp_path / "auth"
    assert nats_auth.main(["--cluster", "hub", "--site", "site-a", "--site", "site-b", "--out", str(out),
                           "hub-1", "site-a/gpu-0", "site-b/gpu-0"]) == 0
    result = nats_auth.generate("hub", ["hub-1", "site-a/gpu-0", "site-b/gpu-0"], out,
                                sites={"site-a": "site-a", "site-b": "site-b"})  # a rerun keeps every password
    auth = {"hub": out / "auth.conf"}
    for site in ("site-a", "site-b"):
        auth[site] = out / "sites" / site / "auth.conf"
        auth[f"{site}.leaf"] = out / "sites" / site / "leafnode.conf"
    sites = await start_sites(tmp_path / "sites", auth, login=("gpuevents-admin", result.role_passwords["admin"]))
    try:
        yield Generated(sites, out, result)
    finally:
        sites.stop()
        await sites.relay.stop()


def bus_as(url: str, user: str, password: str, monkeypatch: pytest.MonkeyPatch, role: str, **kw: object) -> Bus:
    monkeypatch.setenv("NATS_USER", user)
    monkeypatch.setenv("NATS_PASSWORD", password)
    return Bus(NatsConfig(url=url, connect_timeout=2, publish_timeout=2, reconnect_wait=0.2,
                          sites=[SiteConfig(cluster=s, jetstream_domain=s) for s in ("site-a", "site-b")]),
               name=user, role=role, **kw)  # type: ignore[arg-type]


async def test_each_sites_events_reach_the_hub_through_its_own_restricted_link(
    generated: Generated, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = generated
    engine = bus_as(g.sites.hub.url, *g.role("engine"), monkeypatch, "engine")
    await engine.connect()
    try:
        await engine.ensure_streams(cluster="hub")  # the sites' stores, created through their leaf logins
        assert engine.sites_not_set_up == []
        for site in ("site-a", "site-b"):
            agent = bus_as(g.sites.leaves[site].url, *g.agent(site), monkeypatch, "agent", node="gpu-0",
                           cluster=site)
            await agent.connect()
            agent.publish_event(make_event("agent.started", "gpu-0", AgentInfo(node="gpu-0"), cluster=site))
            assert await agent.flush(10)
            await agent.close()

        async def clusters() -> list[str] | None:
            got = [json.loads(m.data)["cluster"] async for m in engine.replay(S.STREAM_EVENTS, S.EVENTS_ALL)]
            return sorted(got) if len(got) == 2 else None
        assert await wait_for(clusters, 20, 0.2, what="both sites' events at the hub") == ["site-a", "site-b"]
    finally:
        await engine.close()


async def test_site_a_cannot_publish_for_site_b_nor_hear_its_commands_across_the_link(
    generated: Generated, tmp_path: Path
) -> None:
    g = generated
    # Site-a's own agent login, at its leaf: site-b's subjects are refused there.
    async with connect(At(g.sites.leaves["site-a"].url), *g.agent("site-a"),
                       S.inbox_prefix("agent", "gpu-0", "site-a")) as a:
        assert a.nc is not None
        await a.nc.publish(S.event_subject("site-b", "gpu-0", "node.snapshot"), b"forged")
        await a.nc.subscribe(S.node_commands_filter("site-b", "gpu-0"))
        await a.nc.flush()
        await wait_for(lambda: a.violations("publish", S.event_subject("site-b", "gpu-0", "node.snapshot")), 5,
                       what=f"site-a's agent refused site-b's subject; got {a.errors}")
        await wait_for(lambda: a.violations("subscription", S.node_commands_filter("site-b", "gpu-0")), 5,
                       what=f"site-a's agent refused site-b's commands; got {a.errors}")

    # Whoever holds site-a's leaf login, even a leaf server that lets anyone publish anything, reaches the hub with
    # site-a's subjects only.
    rogue = _rogue_leaf(tmp_path, g)
    rogue.start()
    try:
        await wait_for(lambda: leaf_links(g.sites.hub) >= 3, 20, 0.1, what="the third leaf link")
        async with connect(At(g.sites.hub.url), *g.role("admin")) as hub, \
                connect(At(g.sites.leaves["site-b"].url), *g.agent("site-b"),
                        S.inbox_prefix("agent", "gpu-0", "site-b")) as b, \
                connect(At(g.sites.hub.url), *g.role("runner"), S.inbox_prefix("runner")) as runner, \
                connect(At(rogue.url), "site-admin", "x") as r:
            assert hub.nc and b.nc and runner.nc and r.nc
            seen = await collect(hub.nc, "gpuevents.evt.>")
            overheard = await collect(r.nc, "gpuevents.cmd.>")

            async def answer(msg: Msg) -> None:
                await msg.respond(b"site-b's gpu-0")

            await b.nc.subscribe(S.node_commands_filter("site-b", "gpu-0"), cb=answer)
            await b.nc.flush()
            await _until_routed(r, hub, seen)
            await r.nc.publish(S.event_subject("site-b", "gpu-0", "node.snapshot"), b"forged for site-b")
            await r.nc.publish(S.event_subject("site-a", "gpu-0", "node.snapshot"), b"site-a's own")
            await r.nc.flush()
            await wait_for(lambda: any(m.data == b"site-a's own" for m in seen), 10, what="site-a's own event")
            reply = await runner.nc.request(S.command_subject("site-b", "gpu-0", "ping"), b"", timeout=10)
            assert reply.data == b"site-b's gpu-0"
            await hub.nc.flush()
            assert [m.data for m in seen if m.subject.startswith("gpuevents.evt.site-b.")] == []
            assert [m.subject for m in overheard if ".site-b." in m.subject] == []
    finally:
        rogue.stop()


async def _until_routed(r: object, hub: object, seen: list[Msg]) -> None:
    """Until the rogue leaf's publishes reach the hub at all (the link's interest propagated)."""
    async def probe() -> bool:
        await r.nc.publish(S.event_subject("site-a", "probe", "node.snapshot"), b"probe")  # type: ignore[attr-defined]
        await asyncio.sleep(0)
        return any(m.data == b"probe" for m in seen)
    await wait_for(probe, 15, 0.2, what="the rogue leaf's link to carry site-a's events")


def _rogue_leaf(tmp_path: Path, g: Generated) -> Server:
    """A leaf server with site-a's link login whose own clients may do anything."""
    port = free_port()
    link = (g.out / "sites" / "site-a" / "leafnode.conf").read_text()
    hub_leaf_port = g.sites.relay.target_port
    conf = tmp_path / "rogue.conf"
    conf.write_text(f'server_name: "rogue"\nhost: 127.0.0.1\nport: {port}\n'
                    'accounts: { GPUEVENTS: { users: [{user: "site-admin", password: "x"}] } }\n'
                    + link.replace("@hub:7422", f"@127.0.0.1:{hub_leaf_port}"))
    return Server("rogue", port, conf, tmp_path / "rogue.log")
