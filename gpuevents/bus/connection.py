"""The `Bus`: one process's connection to NATS and JetStream — connecting and reconnecting, the streams,
publishing, consumers, request/reply and the KV bucket, each kept in its own module of this package."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from gpuevents import subjects as S
from gpuevents.aio import Backoff, Tasks, sleep_or_stop
from gpuevents.bus import streams
from gpuevents.bus.consumer import Consumer, open_consumer
from gpuevents.bus.errors import BusError, BusNoResponders, BusTimeout, BusUnreachable, bus_errors
from gpuevents.bus.kv import Kv, open_bucket
from gpuevents.bus.publishing import AckPipe, BusStats, EventBuffer, PublishItem, js_publish, js_publish_many
from gpuevents.bus.replay import StoredMsg, replay
from gpuevents.bus.serving import Handler, Listener, Subscription, answering
from gpuevents.bus.streams import SiteLink
from gpuevents.config import NatsConfig
from gpuevents.config.sites import SiteConfig
from gpuevents.events import Event, encode_event

log = logging.getLogger("gpuevents.bus")

CONNECT_BACKOFF_S = 0.2
UNREACHABLE_LOG_S = 10.0  # while the first connect fails, one warning this often
CLIENT_CONNECT_S = 3.0  # a command a person runs gives NATS this long, then says so (BusUnreachable)


def _tls_context(cfg: NatsConfig) -> ssl.SSLContext | None:
    t = cfg.tls
    if t.ca_file is None and t.cert_file is None:
        return None
    ctx = ssl.create_default_context(cafile=str(t.ca_file) if t.ca_file else None)
    if t.cert_file is not None:
        ctx.load_cert_chain(str(t.cert_file), str(t.key_file) if t.key_file else None)
    return ctx


class Bus:
    """A connection to NATS and JetStream for one gpuevents process."""

    def __init__(self, config: NatsConfig, *, name: str = "gpuevents", role: str = "admin",
                 node: str | None = None, give_up_after: float | None = None, cluster: str = "default") -> None:
        if not config.servers:
            raise BusError(
                "nats.url is not set: `gpuevents up` starts an embedded server; other commands "
                "need nats.url (or GPUEVENTS_NATS__URL) pointing at your NATS servers"
            )
        self.config = config
        self.name = name
        # DESIGN §7.1: every process's replies come back on its role's inbox (a node's own, for an agent)
        self.role = role
        self.inbox_prefix = config.inbox_prefix or S.inbox_prefix(role, node, cluster)
        self.give_up_after = give_up_after  # a command line's connect: BusUnreachable after this many seconds
        self._connected_once = False
        self._last_error: str = ""
        self._last_error_logged = 0.0
        self.stats = BusStats()
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._kv: Kv | None = None
        self._pipe: AckPipe | None = None
        self._buffer = EventBuffer(config.publish_buffer, self.stats, self._jetstream, lambda: self.connected,
                                   config.publish_timeout)
        self._tasks = Tasks("bus")
        self._subscriptions: list[Subscription] = []  # their handlers' tasks end when the bus closes
        self._closing = asyncio.Event()  # set by close: a connect still retrying gives up
        self.sites_not_set_up: list[SiteConfig] = []  # by ensure_streams: sites that did not answer
        # The engine's view of its sites' links (rules/engine/sites.py keeps it): every site, and those cut off
        self.site_state: dict[str, SiteLink] = {}
        self.sites_cut_off: dict[str, SiteLink] = {}

    # ------------------------------------------------------------ connection
    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def __aenter__(self) -> Bus:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self, *, wait: bool = True) -> None:
        """Connect; with `wait=False`, connect in the background while publishing buffers."""
        self._spawn(self._buffer.run(), "bus publisher")
        if wait:
            await self._connect_forever(self.give_up_after)
        else:
            self._spawn(self._connect_forever(), "bus connect")

    def _address(self) -> str:
        return ", ".join(self.config.servers)

    async def _connect_forever(self, give_up_after: float | None = None) -> None:
        """Connect, retrying; with `give_up_after`, raise BusUnreachable (with the address) once it has passed."""
        backoff = Backoff(CONNECT_BACKOFF_S, self.config.reconnect_wait * 4 or 5.0, jitter=False)
        loop = asyncio.get_running_loop()
        deadline = None if give_up_after is None else loop.time() + give_up_after
        while not self._closing.is_set():
            try:
                # nats-py's first connect retries on its own, forever (max_reconnect_attempts -1): bounded here
                await asyncio.wait_for(self._connect_once(),
                                       None if deadline is None else max(0.01, deadline - loop.time()))
                return
            except (TimeoutError, OSError, nats.errors.Error) as e:
                self._last_error = self._last_error or str(e) or type(e).__name__
                if deadline is not None and loop.time() >= deadline:
                    raise BusUnreachable(f"cannot reach NATS at {self._address()} within {give_up_after:g}s "
                                         f"({self._last_error}); is it running, and is nats.url right?") from None
                delay = backoff.next()
                log.warning("cannot reach NATS at %s (%s); retrying in %.1fs",
                            ", ".join(self.config.servers), e or type(e).__name__, delay)
                await sleep_or_stop(self._closing, delay)

    async def _connect_once(self) -> None:
        cfg = self.config
        opts: dict[str, Any] = {
            "servers": cfg.servers,
            "name": self.name,
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": cfg.reconnect_wait,
            "connect_timeout": cfg.connect_timeout,
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
            "tls": _tls_context(cfg),
            "inbox_prefix": self.inbox_prefix,
        }
        if cfg.creds_file is not None:
            opts["user_credentials"] = str(cfg.creds_file)
        if os.environ.get("NATS_USER"):
            opts["user"] = os.environ["NATS_USER"]
            opts["password"] = os.environ.get("NATS_PASSWORD", "")
        if os.environ.get("NATS_TOKEN"):
            opts["token"] = os.environ["NATS_TOKEN"]
        nc = await nats.connect(**opts)
        self._connected_once = True
        self._nc = nc
        self._js = nc.jetstream(timeout=cfg.publish_timeout, domain=cfg.jetstream_domain)
        self._buffer.wake.set()
        log.info("connected to NATS at %s", nc.connected_url.netloc if nc.connected_url else "?")

    async def _on_error(self, e: Exception) -> None:
        if isinstance(e, nats.errors.SlowConsumerError):
            log.warning("nats: a subscription fell behind and dropped a message (%s)", e)
        elif not self._connected_once:
            # the first connect, which nats-py retries silently: say why it does not get through
            self._last_error = str(e) or type(e).__name__
            now = asyncio.get_running_loop().time()
            if now - self._last_error_logged >= UNREACHABLE_LOG_S:
                self._last_error_logged = now
                log.warning("cannot reach NATS at %s (%s); still trying", self._address(), self._last_error)
        else:
            log.debug("nats: %s", e)

    async def _on_disconnected(self) -> None:
        self.stats.disconnects += 1
        if not self._closing.is_set():
            log.warning("disconnected from NATS; buffering and reconnecting")

    async def _on_reconnected(self) -> None:
        self.stats.reconnects += 1
        log.info("reconnected to NATS; draining %d buffered events", len(self._buffer))
        self._buffer.wake.set()

    @property
    def max_payload(self) -> int:
        """The largest message the server takes, from its INFO (1 MiB unless configured otherwise)."""
        return int(self._nats().max_payload)

    def _nats(self) -> Client:
        if self._nc is None:
            raise BusError("not connected to NATS yet")
        return self._nc

    def _jetstream(self) -> JetStreamContext:
        if self._js is None:
            raise BusError("not connected to NATS yet")
        return self._js

    async def close(self, flush_timeout: float = 5.0) -> None:
        """Drain what is buffered (bounded wait), then close."""
        if len(self._buffer) and self.connected:
            await self.flush(flush_timeout)
        self._closing.set()
        await self._tasks.stop()
        for sub in self._subscriptions:
            await sub.drop()
        if self._nc is not None and not self._nc.is_closed:
            # flush what nats-py still holds, then close; drain() leaves cancelled futures behind
            # when it times out, which asyncio then reports as "never retrieved".
            with contextlib.suppress(TimeoutError, nats.errors.Error):
                if self._nc.is_connected:
                    await self._nc.flush(timeout=max(1, int(flush_timeout)))
            with contextlib.suppress(OSError):  # the connection already lost: nothing left to send
                await self._nc.close()
        if len(self._buffer):
            log.warning("closing with %d events not delivered", len(self._buffer))

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.spawn(coro, name)

    # ------------------------------------------------------------ streams
    async def ensure_streams(self, event_partitions: int | None = None, cluster: str | None = None) -> None:
        """Create or update the streams (gpuevents.bus.streams) and the KV bucket: the engine's or an admin's job,
        never an agent's.

        `event_partitions`: the engines' partitions (engine.partitions), which GPUEVENTS stores its events by
        (1: as published); None keeps what the stream has. `cluster`: the hub's own cluster, whose events the
        hub's stream takes straight when sites keep stores of their own (nats.sites)."""
        self.sites_not_set_up = await streams.ensure_streams(self._nats(), self._jetstream(), self.config,
                                                             event_partitions, cluster)
        await self.kv()

    async def ensure_site_store(self, site: SiteConfig) -> bool:
        """Set up one site's store (a retry once its link is back); True when it answered."""
        return await streams.ensure_site_store(self._nats(), site)

    async def site_answers(self, site: SiteConfig) -> bool:
        """Whether the site's JetStream answers through the hub now."""
        return await streams.site_answers(self._nats(), site)

    async def restart_site_source(self, site: SiteConfig) -> None:
        """Start the hub's source of the site over now (see gpuevents.bus.streams)."""
        await streams.restart_site_source(self._jetstream(), site)

    async def site_links(self) -> list[SiteLink]:
        """How the hub's stream last heard from each site's store (see gpuevents.bus.streams)."""
        return await streams.site_links(self._nats(), self.config)

    async def event_partitions(self) -> int:
        """How many partitions GPUEVENTS stores its events by (1: not partitioned)."""
        info = await self._jetstream().stream_info(S.STREAM_EVENTS)
        t = info.config.subject_transform
        if t is None or not t.dest or "partition(" not in t.dest:
            return 1
        return int(t.dest.split("partition(", 1)[1].split(",", 1)[0])

    async def request_many(self, subject: str, payload: bytes, timeout: float,
                           enough: Callable[[list[bytes]], bool] | None = None) -> list[bytes]:
        """Ask everyone who answers on `subject` (no queue group): the replies that came within `timeout`, or
        as soon as `enough(replies)` says so."""
        nc = self._nats()
        inbox = nc.new_inbox()
        replies: list[bytes] = []
        done = asyncio.Event()

        async def collect(msg: Msg) -> None:
            if msg.headers and msg.headers.get(api.Header.STATUS):
                if msg.headers.get(api.Header.STATUS) == "503":
                    done.set()  # nobody listens: no answer is coming
                return
            replies.append(msg.data)
            if enough is not None and enough(replies):
                done.set()

        with bus_errors(f"asking {subject}"):
            sub = await nc.subscribe(inbox, cb=collect)
            try:
                await nc.publish(subject, payload, reply=inbox)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), timeout)
            finally:
                with contextlib.suppress(nats.errors.Error):
                    await sub.unsubscribe()
        return replies

    async def stream_info(self, stream: str) -> api.StreamInfo:
        return await self._jetstream().stream_info(stream)

    # ------------------------------------------------------------ publishing
    def publish_event(self, event: Event) -> None:
        """Queue `event` for JetStream; never blocks. When the buffer is full the oldest is dropped."""
        self._buffer.add(S.event_subject(event.cluster, event.node, event.type), encode_event(event), event.id)

    def publish_buffered(self, subject: str, payload: bytes, msg_id: str) -> None:
        self._buffer.add(subject, payload, msg_id)

    async def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every buffered event is stored; False if `timeout` passed first."""
        return await self._buffer.flush(timeout)

    async def js_publish(self, subject: str, payload: bytes, *, msg_id: str | None = None,
                         timeout: float | None = None, headers: dict[str, str] | None = None) -> int:
        """Publish to JetStream and wait for the ack; the stream sequence, or BusError."""
        return await js_publish(self._jetstream(), subject, payload, msg_id=msg_id, headers=headers,
                                timeout=timeout or self.config.publish_timeout)

    def _ack_pipe(self) -> AckPipe:
        if self._pipe is None:
            self._pipe = AckPipe(self._nats())
        return self._pipe

    async def js_publish_many(self, items: Sequence[PublishItem], *,
                              timeout: float | None = None) -> list[int | BusError]:
        """Publish many messages, then await their acks together (one wait instead of a round trip each).
        Per item, in order: its stream sequence, or the BusError `js_publish` would have raised."""
        return await js_publish_many(self._ack_pipe(), items, timeout or self.config.publish_timeout)

    async def publish_core(self, subject: str, payload: bytes) -> None:
        await self._nats().publish(subject, payload)

    # ------------------------------------------------------------ request/reply
    async def request(self, subject: str, payload: bytes, timeout: float) -> bytes:
        try:
            msg = await self._nats().request(subject, payload, timeout=timeout)
        except nats.errors.NoRespondersError:
            raise BusNoResponders(f"nobody answers on {subject}") from None
        except (TimeoutError, nats.errors.TimeoutError):
            raise BusTimeout(f"no answer on {subject} within {timeout:.1f}s") from None
        return msg.data

    async def serve(self, subject: str, handler: Handler, queue: str | None = None, *, concurrency: int = 1,
                    what: str = "request") -> Subscription:
        """Answer requests on `subject` with `handler`: a handler that raises answers `{"error": ...}`, one that
        returns None leaves the request to others. `concurrency` above 1: each request is answered in its own
        task, at most that many at once (nats-py otherwise hands over the next one when this one is answered)."""
        return await self.subscribe(subject, answering(self._nats(), handler, what), queue,
                                    concurrency=concurrency, what=what)

    async def subscribe(self, subject: str, handler: Listener, queue: str | None = None, *, concurrency: int = 1,
                        what: str = "message") -> Subscription:
        """Hand every message on `subject` to `handler`, one at a time or (`concurrency`) each in its own task."""
        sub = await Subscription(subject, handler, concurrency, what).open(self._nats(), queue)
        self._subscriptions = [s for s in self._subscriptions if not s.closed] + [sub]
        return sub

    # ------------------------------------------------------------ consumers, history, key-value
    async def consumer(self, stream: str, durable: str, filter_subjects: str | Sequence[str], *,
                       ack_wait: float = 30.0, max_deliver: int = -1,
                       max_ack_pending: int = 20_000, prefetch: bool = False) -> Consumer:
        """A durable pull consumer with explicit acks, created if absent, bound if present: a delivery lost on
        the way is redelivered after `ack_wait`, never acknowledged by a later one. `prefetch`: the next batch
        is requested while this one is handled."""
        with bus_errors(f"opening consumer {durable} on {stream}"):
            return await open_consumer(self._nats(), self._jetstream(), stream, durable, filter_subjects,
                                       ack_wait=ack_wait, max_deliver=max_deliver, max_ack_pending=max_ack_pending,
                                       prefetch=prefetch)

    def replay(self, stream: str, filter_subject: str, since: datetime | None = None,
               batch: int = 512) -> AsyncIterator[StoredMsg]:
        """Every stored message of `stream` on `filter_subject` (from `since`), oldest first. The operator reads
        through consumers of its own names (S.OPERATOR_CONSUMERS), the only ones its login may touch."""
        names = S.OPERATOR_CONSUMERS if self.role == "operator" else ()
        return replay(self._jetstream(), stream, filter_subject, since, batch, names)

    async def kv(self) -> Kv:
        """The `gpuevents-state` bucket (config nats.kv_bucket), created when absent."""
        if self._kv is None:
            with bus_errors(f"opening the KV bucket {self.config.kv_bucket}"):
                self._kv = await open_bucket(self._jetstream(), self.config.kv_bucket,
                                             self.config.streams.replicas, self._ack_pipe())
        return self._kv
