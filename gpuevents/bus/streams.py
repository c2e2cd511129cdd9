"""The streams (DESIGN §7.1, §9): what the engine (or an admin's setup) creates — GPUEVENTS, GPUEVENTS_ACT,
GPUEVENTS_AUDIT, GPUEVENTS_DLQ on the hub and, for every site with a JetStream domain (`nats.sites`), the site's
own store GPUEVENTS_SITE in that domain, sourced into GPUEVENTS. Agents never create streams.

A site's store keeps what the site's agents publish while its link to the hub is down (its leaf acknowledges
it); the hub's stream sources it and catches up once the link is back. Setup adds sources, never removes or
overwrites the ones a stream has (an operator's own sources stay)."""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext, api

from gpuevents import subjects as S
from gpuevents.bus.errors import BusError, BusStoreFull, bus_errors
from gpuevents.config import NatsConfig
from gpuevents.config.sites import SiteConfig

log = logging.getLogger("gpuevents.bus")

DUPLICATE_WINDOW_S = 120.0
DLQ_PER_SUBJECT = 1_000  # malformed messages kept per source subject: one node's flood replaces its own
# Each stream's share of nats.streams.max_bytes (DESIGN §7.1: bounded): past it, its oldest messages go
STREAM_SHARES = {S.STREAM_EVENTS: 2 / 3, S.STREAM_AUDIT: 1 / 6, S.STREAM_ACTIONS: 1 / 12, S.STREAM_DLQ: 1 / 12}
SITE_SETUP_TIMEOUT_S = 5.0  # a cut-off site's store is set up later (the engine retries); not a reason to wait


def _stream(name: str, subjects: list[str], description: str, max_bytes: int, *, max_age: float | None = None,
            retention: api.RetentionPolicy | None = None, per_subject: int | None = None,
            replicas: int = 1) -> api.StreamConfig:
    # bounded (DESIGN §7.1): past max_bytes, or per_subject messages on a subject, the oldest go
    return api.StreamConfig(name=name, subjects=subjects, description=description, max_age=max_age,
                            retention=retention, storage=api.StorageType.FILE, max_bytes=max_bytes,
                            max_msgs_per_subject=per_subject or -1, discard=api.DiscardPolicy.OLD,
                            num_replicas=replicas, duplicate_window=DUPLICATE_WINDOW_S)


def hub_event_subjects(config: NatsConfig, cluster: str | None) -> list[str]:
    """What the hub's GPUEVENTS takes straight from publishers: every event, unless some sites keep stores of their
    own; then only the hub's own cluster's and those of sites without a domain (a site's events come by source,
    never twice)."""
    if not any(s.jetstream_domain for s in config.sites):
        return [S.EVENTS_ALL]
    direct = [cluster] if cluster else []
    direct += [s.cluster for s in config.sites if not s.jetstream_domain and s.cluster not in direct]
    return [S.cluster_events_filter(c) for c in direct]


def site_source(site: SiteConfig) -> api.StreamSource:
    """The hub's source of one site's store. Its events take the stream's own subject transform (the engines'
    partitions), as the events published to the hub do: no transform of the source's own."""
    assert site.jetstream_domain is not None
    return api.StreamSource(name=S.STREAM_SITE, external=api.ExternalStream(
        api=S.jetstream_api(site.jetstream_domain), deliver=S.site_deliver_prefix(site.cluster)))


def site_stream(site: SiteConfig, replicas: int = 1) -> api.StreamConfig:
    return _stream(S.STREAM_SITE, [S.cluster_events_filter(site.cluster)],
                   f"gpuevents: the events of site {site.cluster}, kept here until the hub has them",
                   int(site.max_bytes), max_age=site.max_age, replicas=replicas)


def _source_key(src: api.StreamSource) -> tuple[str, str]:
    return src.name, src.external.api if src.external is not None else ""


def merged_sources(have: list[api.StreamSource] | None, want: list[api.StreamSource]) -> list[api.StreamSource] | None:
    """The stream's sources with the wanted ones (the sites') set: a setup never drops or rewrites another
    source (one an operator added)."""
    ours = {_source_key(s) for s in want}
    keep = [s for s in have or [] if _source_key(s) not in ours] + want
    return keep or None


async def _create_or_update(jsm: JetStreamContext, cfg: api.StreamConfig, keep_transform: bool) -> None:
    assert cfg.name is not None
    with bus_errors(f"creating the stream {cfg.name}"):
        try:
            info = await jsm.stream_info(cfg.name)
        except nats.js.errors.NotFoundError:
            await jsm.add_stream(cfg)
            return
    if info.config.mirror is not None:
        log.warning("%s mirrors %s: left as it is", cfg.name, info.config.mirror.name)
        return
    if keep_transform:  # the engines' partitions, as the stream has them
        cfg.subject_transform = info.config.subject_transform
    cfg.sources = merged_sources(info.config.sources, cfg.sources or [])
    try:
        with bus_errors(f"updating the stream {cfg.name}"):
            await jsm.update_stream(cfg)
    except BusStoreFull as e:  # it runs as it was: not a reason to stay down
        log.warning("%s keeps its settings for now: %s", cfg.name, e)


async def ensure_site_store(nc: Client, site: SiteConfig, timeout: float = SITE_SETUP_TIMEOUT_S) -> bool:
    """Create or update the site's store in its domain; False (and a warning) when the site does not answer."""
    try:
        await _create_or_update(nc.jetstream(domain=site.jetstream_domain, timeout=timeout), site_stream(site), False)
        return True
    except (BusError, nats.errors.Error, TimeoutError) as e:
        log.warning("site %s (JetStream domain %s): its store is not set up (%s); retried while the engine runs",
                    site.cluster, site.jetstream_domain, e)
        return False


async def ensure_streams(nc: Client, js: JetStreamContext, config: NatsConfig, event_partitions: int | None,
                         cluster: str | None) -> list[SiteConfig]:
    """Create or update the hub's streams and every site's store; the sites whose store could not be set up."""
    st = config.streams
    sites = [s for s in config.sites if s.jetstream_domain]
    missed = [s for s in sites if not await ensure_site_store(nc, s)]

    def share(name: str) -> int:
        return int(st.max_bytes * STREAM_SHARES[name])

    events = _stream(S.STREAM_EVENTS, hub_event_subjects(config, cluster), "gpuevents: events from node agents",
                     share(S.STREAM_EVENTS), max_age=st.events_max_age, per_subject=st.events_max_msgs_per_subject,
                     replicas=st.replicas)
    if event_partitions is not None and event_partitions > 1:
        src, dest = S.partition_transform(event_partitions)
        events.subject_transform = api.SubjectTransform(src=src, dest=dest)
    events.sources = [site_source(s) for s in sites] or None
    wanted = [
        events,
        _stream(S.STREAM_ACTIONS, [S.ACTIONS_ALL], "gpuevents: action requests (work queue)",
                share(S.STREAM_ACTIONS), retention=api.RetentionPolicy.WORK_QUEUE, replicas=st.replicas),
        _stream(S.STREAM_AUDIT, [S.AUDIT_ALL], "gpuevents: audit records", share(S.STREAM_AUDIT),
                max_age=st.audit_max_age, replicas=st.replicas),
        _stream(S.STREAM_DLQ, [S.DLQ_ALL], "gpuevents: malformed messages", share(S.STREAM_DLQ),
                max_age=st.dlq_max_age, per_subject=DLQ_PER_SUBJECT, replicas=st.replicas),
    ]
    for cfg in wanted:
        await _create_or_update(js, cfg, keep_transform=cfg.name == S.STREAM_EVENTS and event_partitions is None)
    return missed


async def site_answers(nc: Client, site: SiteConfig, timeout: float = 1.0) -> bool:
    """Whether the site's JetStream answers through the hub now (its leaf link is up)."""
    try:
        await nc.request(f"{S.jetstream_api(site.jetstream_domain)}.INFO", b"", timeout=timeout)
        return True
    except (nats.errors.Error, TimeoutError):
        return False


async def restart_site_source(js: JetStreamContext, site: SiteConfig) -> None:
    """Start the hub's source of a site over now, from where it stopped: after a long cut the server waits up to
    minutes between its own retries. The stream keeps every message; the source resumes after the last one
    it stored (and the duplicate window drops any sent twice)."""
    with bus_errors(f"restarting the source of site {site.cluster}"):
        info = await js.stream_info(S.STREAM_EVENTS)
        cfg = info.config
        have = list(cfg.sources or [])
        key = _source_key(site_source(site))
        cfg.sources = [x for x in have if _source_key(x) != key] or None
        await js.update_stream(cfg)
        cfg.sources = have
        await js.update_stream(cfg)


@dataclass(frozen=True)
class SiteLink:
    """How the hub's GPUEVENTS last heard from one site's store: seconds since (None: never), messages behind."""

    cluster: str
    domain: str
    active_s: float | None
    lag: int
    error: str | None


async def site_links(nc: Client, config: NatsConfig, timeout: float = 2.0) -> list[SiteLink]:
    """Each domain site's source on the hub's GPUEVENTS, as the server reports it (nats-py's StreamInfo leaves
    out which domain a source is in, so the API's own answer is read)."""
    subject = f"{S.jetstream_api(config.jetstream_domain)}.STREAM.INFO.{S.STREAM_EVENTS}"
    with bus_errors("reading the sites' links"):
        msg = await nc.request(subject, b"", timeout=timeout)
    info = json.loads(msg.data)
    by_api = {}
    for src in info.get("sources") or []:
        with contextlib.suppress(AttributeError, KeyError, TypeError):
            by_api[src["external"]["api"]] = src
    links = []
    for site in config.sites:
        if not site.jetstream_domain:
            continue
        src = by_api.get(S.jetstream_api(site.jetstream_domain), {})
        active = src.get("active")
        err = src.get("error")
        links.append(SiteLink(site.cluster, site.jetstream_domain,
                              None if active is None or active < 0 else active / 1e9, int(src.get("lag", 0)),
                              None if not err else str(err.get("description", err))))
    return links
