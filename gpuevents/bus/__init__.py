"""The bus: the one module that imports nats-py — connection, streams, buffered publishing, consumers, KV, request/reply."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import random
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import nats
import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

from gpuevents import subjects as S
from gpuevents.config import NatsConfig
from gpuevents.events import Event, encode_event

log = logging.getLogger(__name__)

DUPLICATE_WINDOW_S = 120.0
_SCAN_SETTLE_S = 0.05
_PUBLISH_BATCH = 256


class BusError(Exception):
    """A bus operation failed."""


class BusTimeout(BusError):
    pass


class BusNoResponders(BusError):
    pass


class KvExists(BusError):
    """`create` of a key that is already there."""


class KvWrongRevision(BusError):
    """`update` whose `last` revision is not the current one."""


@dataclass
class BusStats:
    published: int = 0
    dropped: int = 0
    reconnects: int = 0
    disconnects: int = 0
    publish_retries: int = 0

    buffered: int = 0


@dataclass(frozen=True)
class KvEntry:
    key: str
    value: bytes
    revision: int


class Kv:
    """A JetStream key-value bucket; `create` and `update(last=)` are the compare-and-set tools."""

    def __init__(self, kv: Any, pipe: _AckPipe | None = None) -> None:
        self._kv = kv
        self._pipe = pipe

    async def get(self, key: str) -> KvEntry | None:
        try:
            e = await self._kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        if e.value is None:
            return None
        return KvEntry(key, e.value, e.revision or 0)

    async def put(self, key: str, value: bytes) -> int:
        return int(await self._kv.put(key, value))

    async def create(self, key: str, value: bytes) -> int:
        try:
            return int(await self._kv.create(key, value))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise KvExists(key) from None
        except nats.js.errors.APIError as e:
            if e.err_code == 10071:  # wrong last sequence
                raise KvExists(key) from None
            raise

    async def update(self, key: str, value: bytes, last: int) -> int:
        try:
            return int(await self._kv.update(key, value, last=last))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise KvWrongRevision(key) from None
        except nats.js.errors.APIError as e:
            if e.err_code == 10071:
                raise KvWrongRevision(key) from None
            raise

    async def delete(self, key: str) -> None:
        try:
            await self._kv.delete(key)
        except nats.js.errors.KeyNotFoundError:
            pass

    async def write_many(self, writes: Sequence[tuple[str, bytes | None, int | None]],
                         timeout: float = 5.0) -> list[int | BusError]:
        """Many compare-and-set writes, pipelined: (key, value, last revision or None to create); a None value
        deletes the key (unconditionally, like `delete`). Per write, in order: the new revision, or KvExists /
        KvWrongRevision when the key is not at `last` (a create over a deleted key gets KvExists too: `create`
        handles that case), or another BusError."""
        if self._pipe is None:
            raise BusError("this bucket has no pipelined writes (open it with Bus.kv)")
        pre: str = self._kv._pre
        items: list[tuple[str, bytes, dict[str, str] | None]] = []
        for key, value, last in writes:
            if value is None:
                items.append((f"{pre}{key}", b"", {"KV-Operation": "DEL"}))
            else:
                items.append((f"{pre}{key}", value,
                              {api.Header.EXPECTED_LAST_SUBJECT_SEQUENCE: str(last or 0)}))
        results = await self._pipe.publish(items, timeout)
        out: list[int | BusError] = []
        for (key, _, last), r in zip(writes, results, strict=True):
            err = _ack_error(r, f"KV write of {key}")
            if err is None:
                assert isinstance(r, dict)
                out.append(int(r["seq"]))
            elif isinstance(r, dict) and r["error"].get("err_code") in (10071, 10164):
                out.append(KvExists(key) if not last else KvWrongRevision(key))
            else:
                out.append(err)
        return out

    async def keys(self, prefix: str = "") -> list[str]:
        """Keys starting with `prefix` (a whole-token prefix such as `incident.`)."""
        return [e.key for e in await self._scan(prefix, meta_only=True)]

    async def items(self, prefix: str = "") -> list[KvEntry]:
        """Current entries under `prefix`, in one pass over the bucket."""
        return await self._scan(prefix, meta_only=False)

    async def _scan(self, prefix: str, meta_only: bool) -> list[KvEntry]:
        watcher = await self._kv.watch(f"{prefix}>" if prefix else ">", ignore_deletes=True,
                                       meta_only=meta_only)
        out: list[KvEntry] = []
        last_seen = False  # an entry with nothing pending after it came: the scan is complete
        marker = False
        try:
            while not last_seen:
                try:
                    # nats-py's "initial values done" marker (None) can come before entries still on their way
                    # (it checks the consumer's pending count against what its callback has processed): after
                    # it, wait briefly for them unless the last entry has been seen.
                    e = await watcher.updates(timeout=_SCAN_SETTLE_S if marker else 30.0)
                except nats.errors.TimeoutError:
                    if marker:
                        break
                    raise BusTimeout(f"listing keys under {prefix!r} timed out") from None
                if e is None:
                    marker = True
                    continue
                last_seen = e.delta == 0
                if e.operation is None and e.key.startswith(prefix):
                    out.append(KvEntry(e.key, e.value or b"", e.revision or 0))
        finally:
            await watcher.stop()
        return out


@dataclass(frozen=True)
class PublishItem:
    """One message for `Bus.js_publish_many`."""

    subject: str
    payload: bytes
    msg_id: str | None = None
    headers: dict[str, str] | None = None


class _AckPipe:
    """JetStream publishes whose acks are awaited together: one wildcard reply subscription and a future per
    message (nats-py's `publish_async` loses error replies: its reply handler raises instead of failing the
    future, so a refused write would only time out)."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._prefix = ""
        self._futures: dict[str, asyncio.Future[Any]] = {}
        self._n = 0

    async def _on_reply(self, msg: Msg) -> None:
        fut = self._futures.pop(msg.subject[len(self._prefix):], None)
        if fut is None or fut.done():
            return
        if msg.headers and msg.headers.get(api.Header.STATUS) == "503":
            fut.set_exception(nats.errors.NoRespondersError())
            return
        try:
            fut.set_result(orjson.loads(msg.data))
        except orjson.JSONDecodeError as e:
            fut.set_exception(BusError(f"unreadable JetStream ack: {e}"))

    async def publish(
        self, items: Sequence[tuple[str, bytes, dict[str, str] | None]], timeout: float,
    ) -> list[dict[str, Any] | BaseException]:
        """Publish every item, then wait for all their acks (up to `timeout`): per item, in order, the ack's
        JSON (`seq`, or `error` with `err_code`) or the exception it got (TimeoutError when none came)."""
        if not self._prefix:
            inbox = self._nc.new_inbox()
            await self._nc.subscribe(f"{inbox}.*", cb=self._on_reply)
            self._prefix = f"{inbox}."
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        tokens: list[str] = []
        futures: list[asyncio.Future[Any]] = []
        for subject, payload, headers in items:
            self._n += 1
            token = str(self._n)
            fut: asyncio.Future[Any] = loop.create_future()
            self._futures[token] = fut
            tokens.append(token)
            futures.append(fut)
            try:
                await self._nc.publish(subject, payload, reply=self._prefix + token, headers=headers)
            except (nats.errors.Error, OSError) as e:
                self._futures.pop(token, None)
                fut.set_exception(e)
        waiting = [f for f in futures if not f.done()]
        if waiting:
            await asyncio.wait(waiting, timeout=max(0.0, deadline - loop.time()))
        out: list[dict[str, Any] | BaseException] = []
        for token, fut in zip(tokens, futures, strict=True):
            if not fut.done():
                self._futures.pop(token, None)
                fut.cancel()
                out.append(TimeoutError())
            else:
                err = fut.exception()
                out.append(err if err is not None else fut.result())
        return out


def _ack_error(r: dict[str, Any] | BaseException, what: str) -> BusError | None:
    """None for a stored message's ack, else the BusError its reply or exception means."""
    if isinstance(r, dict):
        if "error" not in r:
            return None
        e = r["error"]
        return BusError(f"{what} failed: {e.get('description', e)} (err_code {e.get('err_code')})")
    if isinstance(r, nats.errors.NoRespondersError):
        return BusNoResponders(f"no stream stores {what.rsplit(' ', 1)[-1]}")
    if isinstance(r, TimeoutError | nats.errors.TimeoutError):
        return BusTimeout(f"{what} timed out")
    if isinstance(r, BusError):
        return r
    return BusError(f"{what} failed: {r}")


class Delivery:
    """One message from a durable consumer, with its acknowledgements. Its JetStream metadata (delivery
    count, stream sequence, time) is read from the ack subject when first asked for."""

    __slots__ = ("_md", "_msg", "data", "headers", "subject")

    def __init__(self, msg: Msg) -> None:
        self._msg = msg
        self._md: Msg.Metadata | None = None
        self.subject: str = msg.subject
        self.data: bytes = msg.data
        self.headers: dict[str, str] = msg.headers or {}

    def _metadata(self) -> Msg.Metadata:
        if self._md is None:
            self._md = self._msg.metadata
        return self._md

    @property
    def num_delivered(self) -> int:
        return self._metadata().num_delivered or 1

    @property
    def stream_seq(self) -> int:
        seq = self._metadata().sequence
        return seq.stream if seq else 0

    @property
    def time(self) -> datetime | None:
        return self._metadata().timestamp

    async def ack(self) -> None:
        await _ack_call(self._msg.ack())

    async def nak(self, delay: float | None = None) -> None:
        await _ack_call(self._msg.nak(delay=delay))

    async def term(self) -> None:
        await _ack_call(self._msg.term())

    async def in_progress(self) -> None:
        await _ack_call(self._msg.in_progress())


async def _ack_call(coro: Awaitable[Any]) -> None:
    try:
        await coro
    except nats.errors.MsgAlreadyAckdError:
        pass
    except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError) as e:
        # Lost with the connection: JetStream redelivers after ack_wait, which consumers tolerate.
        log.warning("acknowledgement lost with the connection: %s", e)


_REFUSAL_BACKOFF_MAX_S = 5.0
_CLOSE_MARGIN_S = 1.0
_CLOSE_QUIET_S = 0.1
_NO_WAIT_LOST_S = 5.0  # a no_wait request not over by then is taken as lost (a reconnect)


class Consumer:
    """A durable pull consumer with explicit acks. A fetch that times out means "no work", not an error.

    It pulls on its own inbox, one pull request open at a time, each request with its own reply token so
    that a status (404 no messages, 408 expired, 409 refused, 503 no consumer) is tied to its request.
    Messages land in a local queue as they arrive and a fetch returns what is queued as soon as there is
    some, without a task or a timer per message. A request asks for at most what the caller can take
    (`batch`), so nothing more is claimed than was asked for: the first one of a fetch does not wait
    (`no_wait`: what is there now); only when there was nothing does one wait, up to the fetch's timeout.

    With `prefetch`, the next request goes out as soon as the previous one is over and at most one batch
    is queued, so the next batch is on its way while this one is handled. `close` lets the open request
    finish and gives every queued or still arriving message back (nak), so another consumer gets them at
    once rather than after ack_wait. A refused request is logged and retried with a growing delay; a
    consumer that is gone is created again (`recreate`)."""

    def __init__(self, nc: Client, stream: str, durable: str, *, prefetch: bool = False,
                 recreate: Callable[[], Awaitable[None]] | None = None) -> None:
        self._nc = nc
        self.stream = stream
        self.durable = durable
        self.prefetch = prefetch
        self._recreate = recreate
        self._next_subject = f"{api.DEFAULT_PREFIX}.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._inbox = nc.new_inbox()
        self._sub: Subscription | None = None
        self._queue: collections.deque[Msg] = collections.deque()
        self._arrived = asyncio.Event()
        self._token = 0  # the open request's reply token: requests are numbered, this counts them
        self._open = False
        self._owed = 0  # messages the open request may still deliver
        self._open_until = 0.0  # loop time after which the open request is taken as lost
        self._found_none = False  # the last request ended finding nothing more: the next one may wait
        self._refusal: tuple[str, str] | None = None
        self._refusals = 0  # refusals in a row
        self._retry_at = 0.0  # loop time before which no request goes out (backing off)
        self._closing = False
        self._batch = 1
        self._expires_s = 1.0

    async def start(self) -> Consumer:
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_msg)
        return self

    @property
    def requests_sent(self) -> int:
        return self._token

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers
        status = headers.get(api.Header.STATUS) if headers and not msg.reply else None
        if status is None:
            if self._closing:
                await Delivery(msg).nak()
            else:
                self._queue.append(msg)
                self._refusals = 0
            self._owed -= 1
            if self._open and self._owed <= 0:
                await self._end(found_none=False)
        elif status != "100" and msg.subject == f"{self._inbox}.{self._token}" and self._open:
            # 100 is a heartbeat; any other status ends its request
            if status not in ("404", "408"):
                self._refusal = (status, headers.get(api.Header.DESCRIPTION, "") if headers else "")
            await self._end(found_none=True)
        self._arrived.set()

    async def _end(self, found_none: bool) -> None:
        self._open = False
        self._owed = 0
        self._found_none = found_none
        if self._may_prefetch():
            await self._request()

    async def _request(self) -> None:
        """Open a pull request: `no_wait` unless the last one found nothing (then it waits up to expires)."""
        loop = asyncio.get_running_loop()
        self._token += 1
        self._open, self._owed = True, self._batch
        body: dict[str, Any] = {"batch": self._batch}
        if self._found_none:
            body["expires"] = int(self._expires_s * 1e9)
            self._open_until = loop.time() + self._expires_s + _CLOSE_MARGIN_S
        else:
            body["no_wait"] = True
            self._open_until = loop.time() + _NO_WAIT_LOST_S
        try:
            await self._nc.publish(self._next_subject, orjson.dumps(body), reply=f"{self._inbox}.{self._token}")
        except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError,
                nats.errors.OutboundBufferLimitError):
            self._open = False

    async def fetch(self, batch: int = 256, timeout: float = 1.0) -> list[Delivery]:
        """Up to `batch` messages, or [] when none came within `timeout`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._batch, self._expires_s = max(1, batch), max(0.05, timeout)
        while not self._queue:
            if self._closing:
                return []
            if self._refusal is not None:
                await self._refused()
            if loop.time() < self._retry_at:  # backing off after a refusal
                await asyncio.sleep(max(0.0, min(deadline, self._retry_at) - loop.time()))
                if loop.time() < self._retry_at:
                    return []
            if self._open and loop.time() > self._open_until:
                log.debug("consumer %s: pull request %d never ended (lost in a reconnect?)", self.durable,
                          self._token)
                self._open, self._found_none = False, True
            if not self._open:
                await self._request()
            if not await self._wait(deadline):
                return []
        out = [Delivery(self._queue.popleft()) for _ in range(min(batch, len(self._queue)))]
        if not self._open and self._may_prefetch():
            await self._request()
        return out

    def _may_prefetch(self) -> bool:
        return (self.prefetch and not self._closing and self._refusal is None and len(self._queue) <= self._batch
                and asyncio.get_running_loop().time() >= self._retry_at)

    async def _refused(self) -> None:
        """Log a refused request (the first, the tenth, every hundredth in a row), recreate a consumer that is
        gone, and set when the next request may go: later each time, up to _REFUSAL_BACKOFF_MAX_S. The count
        starts again when a message comes."""
        status, description = self._refusal or ("", "")
        self._refusal = None
        self._refusals += 1
        gone = status == "503" or "deleted" in description.lower()
        if self._refusals in (1, 10) or self._refusals % 100 == 0:
            log.warning("consumer %s on %s: pull request refused (%s %s)%s", self.durable, self.stream, status,
                        description, "; creating it again" if gone and self._recreate else "")
        if gone and self._recreate is not None:
            with contextlib.suppress(BusError, nats.errors.Error):
                await self._recreate()
        delay = min(_REFUSAL_BACKOFF_MAX_S, 0.05 * 2 ** min(self._refusals, 10))
        self._retry_at = asyncio.get_running_loop().time() + delay

    async def _wait(self, until: float) -> bool:
        """Wait until something arrives (a message or a status), up to loop time `until`."""
        remaining = until - asyncio.get_running_loop().time()
        if remaining <= 0:
            return False
        self._arrived.clear()
        try:
            await asyncio.wait_for(self._arrived.wait(), remaining)
        except TimeoutError:
            return False
        return True

    async def pending(self) -> int:
        info = await self._nc.jetstream().consumer_info(self.stream, self.durable)
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)

    async def close(self) -> None:
        """Give back what is queued and what the open request still delivers (nak), then unsubscribe."""
        self._closing = True
        queued, self._queue = list(self._queue), collections.deque()
        for msg in queued:
            await Delivery(msg).nak()
        # What the open request is still sending arrives within moments; a waiting request whose messages have
        # stopped coming is dropped by the server with the subscription. Anything later is redelivered after
        # ack_wait (explicit acks: delayed, never lost).
        loop = asyncio.get_running_loop()
        limit = min(self._open_until, loop.time() + self._expires_s + _CLOSE_MARGIN_S)
        while self._open and self._nc.is_connected and await self._wait(min(limit, loop.time() + _CLOSE_QUIET_S)):
            pass
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(nats.errors.ConnectionClosedError, nats.errors.BadSubscriptionError):
                await sub.unsubscribe()


@dataclass(frozen=True)
class StoredMsg:
    subject: str
    data: bytes
    seq: int
    time: datetime | None


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

    def __init__(self, config: NatsConfig, *, name: str = "gpuevents") -> None:
        if not config.servers:
            raise BusError(
                "nats.url is not set: `gpuevents up` starts an embedded server; other commands "
                "need nats.url (or GPUEVENTS_NATS__URL) pointing at your NATS servers"
            )
        self.config = config
        self.name = name
        self.stats = BusStats()
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._kv: Kv | None = None
        self._pipe: _AckPipe | None = None
        self._buffer: collections.deque[tuple[str, bytes, str]] = collections.deque()
        self._wake = asyncio.Event()
        self._connected = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

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
        self._spawn(self._publisher(), "publisher")
        if wait:
            await self._connect_forever()
        else:
            self._spawn(self._connect_forever(), "connect")

    async def _connect_forever(self) -> None:
        delay = 0.2
        while not self._closing:
            try:
                await self._connect_once()
                return
            except (TimeoutError, OSError, nats.errors.Error) as e:
                log.warning("cannot reach NATS at %s (%s); retrying in %.1fs",
                            ", ".join(self.config.servers), e or type(e).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.reconnect_wait * 4 or 5.0)

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
        }
        if cfg.inbox_prefix:
            opts["inbox_prefix"] = cfg.inbox_prefix
        if cfg.creds_file is not None:
            opts["user_credentials"] = str(cfg.creds_file)
        if os.environ.get("NATS_USER"):
            opts["user"] = os.environ["NATS_USER"]
            opts["password"] = os.environ.get("NATS_PASSWORD", "")
        if os.environ.get("NATS_TOKEN"):
            opts["token"] = os.environ["NATS_TOKEN"]
        nc = await nats.connect(**opts)
        self._nc = nc
        self._js = nc.jetstream(timeout=cfg.publish_timeout)
        self._connected.set()
        self._wake.set()
        log.info("connected to NATS at %s", nc.connected_url.netloc if nc.connected_url else "?")

    async def _on_error(self, e: Exception) -> None:
        if isinstance(e, nats.errors.SlowConsumerError):
            log.warning("nats: a subscription fell behind and dropped a message (%s)", e)
        else:
            log.debug("nats: %s", e)

    async def _on_disconnected(self) -> None:
        self.stats.disconnects += 1
        if not self._closing:
            log.warning("disconnected from NATS; buffering and reconnecting")

    async def _on_reconnected(self) -> None:
        self.stats.reconnects += 1
        log.info("reconnected to NATS; draining %d buffered events", len(self._buffer))
        self._wake.set()

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
        if self._buffer and self.connected:
            await self.flush(flush_timeout)
        self._closing = True
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            try:
                await t
            except asyncio.CancelledError:
                pass
        if self._nc is not None and not self._nc.is_closed:
            # flush what nats-py still holds, then close; drain() leaves cancelled futures behind
            # when it times out, which asyncio then reports as "never retrieved".
            with contextlib.suppress(TimeoutError, nats.errors.Error):
                if self._nc.is_connected:
                    await self._nc.flush(timeout=max(1, int(flush_timeout)))
            await self._nc.close()
        if self._buffer:
            log.warning("closing with %d events not delivered", len(self._buffer))

    def _spawn(self, coro: Awaitable[None], what: str) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("bus task %s finished unexpectedly: %r", what, t.exception())

        task.add_done_callback(done)

    # ------------------------------------------------------------ streams
    async def ensure_streams(self) -> None:
        """Create or update GPUEVENTS, GPUEVENTS_ACT, GPUEVENTS_AUDIT, GPUEVENTS_DLQ and the KV bucket."""
        st = self.config.streams

        def stream(name: str, subject: str, description: str, max_age: float | None = None,
                   retention: api.RetentionPolicy | None = None) -> api.StreamConfig:
            return api.StreamConfig(name=name, subjects=[subject], description=description, max_age=max_age,
                                    retention=retention, storage=api.StorageType.FILE,
                                    num_replicas=st.replicas, duplicate_window=DUPLICATE_WINDOW_S)

        wanted = [
            stream(S.STREAM_EVENTS, S.EVENTS_ALL, "gpuevents: events from node agents", st.events_max_age),
            stream(S.STREAM_ACTIONS, S.ACTIONS_ALL, "gpuevents: action requests (work queue)",
                   retention=api.RetentionPolicy.WORK_QUEUE),
            stream(S.STREAM_AUDIT, S.AUDIT_ALL, "gpuevents: audit records", st.audit_max_age),
            stream(S.STREAM_DLQ, S.DLQ_ALL, "gpuevents: malformed messages", st.dlq_max_age),
        ]
        jsm = self._jetstream()
        for cfg in wanted:
            assert cfg.name is not None
            try:
                await jsm.stream_info(cfg.name)
                await jsm.update_stream(cfg)
            except nats.js.errors.NotFoundError:
                await jsm.add_stream(cfg)
        await self.kv()

    async def stream_info(self, stream: str) -> api.StreamInfo:
        return await self._jetstream().stream_info(stream)

    # ------------------------------------------------------------ publishing
    def publish_event(self, event: Event) -> None:
        """Queue `event` for JetStream; never blocks. When the buffer is full the oldest is dropped."""
        subject = S.event_subject(event.cluster, event.node, event.type)
        self.publish_buffered(subject, encode_event(event), event.id)

    def publish_buffered(self, subject: str, payload: bytes, msg_id: str) -> None:
        limit = self.config.publish_buffer
        if limit and len(self._buffer) >= limit:
            self._buffer.popleft()
            self.stats.dropped += 1
            if self.stats.dropped == 1 or self.stats.dropped % 1000 == 0:
                log.warning("publish buffer full (%d); dropped %d events so far", limit, self.stats.dropped)
        self._buffer.append((subject, payload, msg_id))
        self.stats.buffered = len(self._buffer)
        self._idle.clear()
        self._wake.set()

    async def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every buffered event is stored; False if `timeout` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    async def _publisher(self) -> None:
        backoff = 0.1
        while True:
            if not self._buffer:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            if not self.connected:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), 1.0)
                except TimeoutError:
                    pass
                continue
            batch = [self._buffer.popleft() for _ in range(min(_PUBLISH_BATCH, len(self._buffer)))]
            results = await asyncio.gather(
                *(self._publish_one(s, p, i) for s, p, i in batch), return_exceptions=True
            )
            failed = [item for item, r in zip(batch, results, strict=True) if r is not None]
            self.stats.published += len(batch) - len(failed)
            if failed:
                self.stats.publish_retries += len(failed)
                self._buffer.extendleft(reversed(failed))
                self.stats.buffered = len(self._buffer)
                await asyncio.sleep(backoff * (1 + random.random()))  # backoff while NATS recovers
                backoff = min(backoff * 2, 2.0)
            else:
                backoff = 0.1
            self.stats.buffered = len(self._buffer)

    async def _publish_one(self, subject: str, payload: bytes, msg_id: str) -> Exception | None:
        try:
            await self._jetstream().publish(
                subject, payload, headers={"Nats-Msg-Id": msg_id}, timeout=self.config.publish_timeout
            )
            return None
        except (TimeoutError, nats.errors.Error, BusError, OSError) as e:
            return e

    async def js_publish(self, subject: str, payload: bytes, *, msg_id: str | None = None,
                         timeout: float | None = None, headers: dict[str, str] | None = None) -> int:
        """Publish to JetStream and wait for the ack; the stream sequence, or BusError."""
        headers = dict(headers or {})
        if msg_id:
            headers["Nats-Msg-Id"] = msg_id
        try:
            ack = await self._jetstream().publish(subject, payload, headers=headers or None,
                                                  timeout=timeout or self.config.publish_timeout)
        except nats.js.errors.NoStreamResponseError:
            raise BusNoResponders(f"no stream stores {subject}") from None
        except (TimeoutError, nats.errors.TimeoutError):
            raise BusTimeout(f"JetStream publish to {subject} timed out") from None
        except nats.errors.Error as e:
            raise BusError(f"JetStream publish to {subject} failed: {e}") from e
        return int(ack.seq)

    def _ack_pipe(self) -> _AckPipe:
        if self._pipe is None:
            self._pipe = _AckPipe(self._nats())
        return self._pipe

    async def js_publish_many(self, items: Sequence[PublishItem], *,
                              timeout: float | None = None) -> list[int | BusError]:
        """Publish many messages to JetStream, pipelined: all are sent, then their acks are awaited together
        (one wait instead of a round trip each). Per item, in order: its stream sequence, or the BusError
        `js_publish` would have raised (BusNoResponders, BusTimeout, BusError)."""
        if not items:
            return []
        prepared: list[tuple[str, bytes, dict[str, str] | None]] = []
        for it in items:
            headers = dict(it.headers or {})
            if it.msg_id:
                headers["Nats-Msg-Id"] = it.msg_id
            prepared.append((it.subject, it.payload, headers or None))
        results = await self._ack_pipe().publish(prepared, timeout or self.config.publish_timeout)
        out: list[int | BusError] = []
        for it, r in zip(items, results, strict=True):
            err = _ack_error(r, f"JetStream publish to {it.subject}")
            if err is None:
                assert isinstance(r, dict)
                out.append(int(r["seq"]))
            else:
                out.append(err)
        return out

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

    async def serve(self, subject: str, handler: Callable[[bytes, str], Awaitable[bytes]],
                    queue: str | None = None) -> Any:
        """Answer requests on `subject`; a handler that raises answers `{"error": ...}`."""

        async def cb(msg: Msg) -> None:
            try:
                reply = await handler(msg.data, msg.subject)
            except Exception as e:
                log.exception("handler for %s failed", msg.subject)
                reply = orjson.dumps({"error": f"{type(e).__name__}: {e}"})
            if msg.reply:
                await msg.respond(reply)

        return await self._nats().subscribe(subject, queue=queue or "", cb=cb)

    async def subscribe(self, subject: str, handler: Callable[[Msg], Awaitable[None]],
                        queue: str | None = None) -> Any:
        return await self._nats().subscribe(subject, queue=queue or "", cb=handler)

    # ------------------------------------------------------------ consumers
    async def consumer(self, stream: str, durable: str, filter_subjects: str | Sequence[str], *,
                       ack_wait: float = 30.0, max_deliver: int = -1,
                       max_ack_pending: int = 20_000, prefetch: bool = False) -> Consumer:
        """A durable pull consumer with explicit acks; created if absent, bound if present.

        Every message is acknowledged on its own: a delivery lost on the way (a reconnect) is redelivered
        after `ack_wait`, never acknowledged by a later one. `prefetch`: the next batch is requested while
        this one is handled (see Consumer)."""
        filters = [filter_subjects] if isinstance(filter_subjects, str) else list(filter_subjects)
        cfg = api.ConsumerConfig(
            durable_name=durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=ack_wait,
            max_deliver=max_deliver,
            max_ack_pending=max_ack_pending,
            deliver_policy=api.DeliverPolicy.ALL,
        )
        if len(filters) > 1:
            cfg.filter_subjects = filters
        else:
            cfg.filter_subject = filters[0]
        js = self._jetstream()

        async def create() -> None:
            await js.add_consumer(stream, config=cfg)

        try:
            info = await js.consumer_info(stream, durable)
        except nats.js.errors.NotFoundError:
            await create()
        else:
            if info.config.ack_policy != api.AckPolicy.EXPLICIT:
                log.warning("consumer %s on %s acknowledges with %s, not explicitly: a delivery lost on the way "
                            "can be acknowledged with a later one. Delete it to have it created again.",
                            durable, stream, info.config.ack_policy)
        return await Consumer(self._nats(), stream, durable, prefetch=prefetch, recreate=create).start()

    async def replay(self, stream: str, filter_subject: str, since: datetime | None = None,
                     batch: int = 512) -> AsyncIterator[StoredMsg]:
        """Every stored message of `stream` on `filter_subject` (from `since`), oldest first."""
        js = self._jetstream()
        try:
            info = await js.stream_info(stream, subjects_filter=None)
        except nats.js.errors.NotFoundError:
            return
        if not info.state.messages:
            return
        cfg = api.ConsumerConfig(ack_policy=api.AckPolicy.NONE, inactive_threshold=30.0,
                                 deliver_policy=api.DeliverPolicy.ALL, mem_storage=True)
        if since is not None:
            cfg.deliver_policy = api.DeliverPolicy.BY_START_TIME
            cfg.opt_start_time = since.astimezone(UTC)
        sub = await js.pull_subscribe(filter_subject, stream=stream, config=cfg)
        try:
            while True:
                try:
                    msgs = await sub.fetch(batch, timeout=1.0)
                except (TimeoutError, nats.errors.TimeoutError):
                    return
                for m in msgs:
                    md = m.metadata
                    yield StoredMsg(m.subject, m.data, md.sequence.stream if md.sequence else 0,
                                    md.timestamp)
                if msgs and (msgs[-1].metadata.num_pending or 0) == 0:
                    return
        finally:
            try:
                await sub.unsubscribe()
            except nats.errors.Error:
                pass

    async def stored(self, stream: str, limit: int = 10_000) -> list[StoredMsg]:
        """The messages a stream holds now, read one by one (any retention, work queues included)."""
        js = self._jetstream()
        state = (await js.stream_info(stream)).state
        out: list[StoredMsg] = []
        for seq in range(state.first_seq, min(state.last_seq, state.first_seq + limit - 1) + 1):
            try:
                m = await js.get_msg(stream, seq)
            except nats.js.errors.NotFoundError:
                continue
            out.append(StoredMsg(m.subject or "", m.data or b"", seq, None))
        return out

    # ------------------------------------------------------------ key-value
    async def kv(self) -> Kv:
        """The `gpuevents-state` bucket (config nats.kv_bucket), created when absent."""
        if self._kv is None:
            js = self._jetstream()
            bucket = self.config.kv_bucket
            try:
                handle = await js.key_value(bucket)
            except nats.js.errors.BucketNotFoundError:
                handle = await js.create_key_value(
                    bucket=bucket, history=1, replicas=self.config.streams.replicas,
                    description="gpuevents: incidents, snoozes, leases, idempotency keys")
            self._kv = Kv(handle, self._ack_pipe())
        return self._kv
