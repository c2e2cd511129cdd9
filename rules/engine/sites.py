"""Sites on leaf servers (DESIGN §9): how the hub's stream hears from each site's store, told as a site — linked, or
cut off since when — never as that site's nodes going idle one by one.

`SiteWatch` reads the hub's sources every few seconds (gpuevents.bus.streams.site_links), sets up a site's
store once its link answers (one that was cut off when the engine started), logs a site cut off and back, and
keeps the bus's view (`Bus.cut_off`) that the committer reads: no remedy is decided for a site cut off, whose
readings may be stale; its requests are held, audited as such."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from gpuevents.aio import sleep_or_stop
from gpuevents.bus import Bus, BusError
from gpuevents.bus.streams import SiteLink
from gpuevents.clock import Clock
from gpuevents.records import ActionRequest
from gpuevents.wire.manual import RESTORES
from gpuevents.wire.status import SiteView

log = logging.getLogger(__name__)

CUT_OFF_S = 10.0  # the hub's source hears from a linked site's store about every second
WATCH_S = 5.0


def is_cut_off(link: SiteLink, cut_off_s: float = CUT_OFF_S) -> bool:
    return link.active_s is None or link.active_s > cut_off_s


def site_view(link: SiteLink, now: datetime, cut: bool) -> SiteView:
    """How `gpuevents status` shows a site; `cut`: as the watch decided it (cut off, or catching up)."""
    since = None if link.active_s is None else now - timedelta(seconds=link.active_s)
    return SiteView(cluster=link.cluster, domain=link.domain, linked=not cut, last_heard=since,
                    behind=link.lag, error=link.error)


def held_for_site(request: ActionRequest, link: SiteLink | None, now: datetime) -> ActionRequest:
    """`request` held when its site is cut off: its readings may be stale, and its agents out of reach. An undo
    (resume, uncordon) reads no readings: it goes ahead."""
    if link is None or request.decision not in ("run", "dry_run") or request.type in RESTORES:
        return request
    heard = "never heard from" if link.active_s is None else f"last heard {link.active_s:.0f}s ago"
    return request.model_copy(update={"decision": "held", "reason": (
        f"site {link.cluster} is cut off from the hub ({heard}): no remedy on readings that may be stale")})


class SiteWatch:
    """Polls the hub's view of every site with a JetStream domain (nats.sites) until stopped."""

    def __init__(self, bus: Bus, clock: Clock, interval: float = WATCH_S, cut_off_s: float = CUT_OFF_S) -> None:
        self.bus = bus
        self.clock = clock
        self.interval = interval
        self.cut_off_s = cut_off_s
        self._missing = list(bus.sites_not_set_up)
        self._nudged: dict[str, float] = {}  # site -> when its source was last started over (clock.monotonic)
        self._started = clock.monotonic()  # a source just set up has not heard from its site yet: not a cut

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.poll()
            await sleep_or_stop(stop, self.interval)

    async def poll(self) -> None:
        for site in list(self._missing):
            if await self.bus.ensure_site_store(site):
                log.info("site %s: its store is set up", site.cluster)
                self._missing.remove(site)
        try:
            links = await self.bus.site_links()
        except (BusError, TimeoutError) as e:
            log.debug("reading the sites' links: %s", e)
            return
        before = dict(self.bus.sites_cut_off)
        # cut off (never heard from: once a source just set up had its time), or back but still catching up
        settled = self.clock.monotonic() - self._started >= self.cut_off_s
        now_cut = {x.cluster: x for x in links
                   if (is_cut_off(x, self.cut_off_s) and (settled or x.active_s is not None))
                   or (x.cluster in before and x.lag > 0)}
        for cluster, link in now_cut.items():
            if cluster not in before:
                log.warning("site %s is cut off from the hub (%s); what it stores meanwhile arrives when it is back; "
                            "no remedy is decided for it until then", cluster,
                            "never heard from" if link.active_s is None else f"last heard {link.active_s:.0f}s ago")
        for link in links:
            if link.cluster in before and link.cluster not in now_cut:
                log.info("site %s is linked again, the hub caught up with its store", link.cluster)
        self.bus.site_state = {x.cluster: x for x in links}
        self.bus.sites_cut_off = now_cut
        for cluster, link in now_cut.items():
            if is_cut_off(link, self.cut_off_s):
                await self._nudge(cluster)

    async def _nudge(self, cluster: str) -> None:
        """A site whose link is back while the hub's source still waits (the server's retries back off to minutes
        after a long cut): its source is started over at once, at most once per cut-off period."""
        site = self.bus.config.site(cluster)
        now = self.clock.monotonic()
        if site is None or now - self._nudged.get(cluster, -1e9) < self.cut_off_s:
            return
        if not await self.bus.site_answers(site):
            return
        self._nudged[cluster] = now
        try:
            await self.bus.restart_site_source(site)
            log.info("site %s answers again: the hub's source of its store starts over now", cluster)
        except BusError as e:
            log.warning("site %s answers again, but its source could not be restarted (%s); the server retries "
                        "on its own", cluster, e)
