"""Pull consumers: `Delivery` (one message and its acknowledgements) and the durable `Consumer`."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

from gpuevents.aio import Backoff
from gpuevents.bus.errors import BusError

log = logging.getLogger("gpuevents.bus")


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
        await ack_call(self._msg.ack())

    async def nak(self, delay: float | None = None) -> None:
        await ack_call(self._msg.nak(delay=delay))

    async def term(self) -> None:
        await ack_call(self._msg.term())

    async def in_progress(self) -> None:
        await ack_call(self._msg.in_progress())


async def ack_call(coro: Awaitable[Any]) -> None:
    try:
        await coro
    except nats.errors.MsgAlreadyAckdError:
        pass
    except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError) as e:
        # Lost with the connection: JetStream redelivers after ack_wait, which consumers tolerate.
        log.warning("acknowledgement lost with the connection: %s", e)


REFUSAL_BACKOFF_BASE_S = 0.1  # the first refusal waits this long, each next one twice as long
REFUSAL_BACKOFF_MAX_S = 5.0
CLOSE_MARGIN_S = 1.0
CLOSE_QUIET_S = 0.1
NO_WAIT_LOST_S = 5.0  # a no_wait request not over by then is taken as lost (a reconnect)


class Consumer:
    """A durable pull consumer with explicit acks; a fetch that times out means "no work", not an error.

    One pull request is open at a time, on the consumer's own inbox, asking for no more than the caller can
    take: `no_wait` first, a waiting one only when there was nothing. With `prefetch` the next request goes
    out while a batch is handled. docs/engine.md ("What happens to an event") tells why."""

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
        self._token = 0  # the open request's reply token; a late status for an earlier one ends nothing
        self._open = False
        self._owed = 0  # messages the open request may still deliver
        self._open_until = 0.0  # loop time after which the open request is taken as lost
        self._found_none = False  # the last request ended finding nothing more: the next one may wait
        self._refusal: tuple[str, str] | None = None
        self._backoff = Backoff(REFUSAL_BACKOFF_BASE_S, REFUSAL_BACKOFF_MAX_S, jitter=False)  # refusals in a row
        self._retry_at = 0.0  # loop time before which no request goes out (backing off)
        self._closing = False
        self._batch = 1
        self._expires_s = 1.0

    async def start(self) -> Consumer:
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self._on_msg)
        return self

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers
        status = headers.get(api.Header.STATUS) if headers and not msg.reply else None
        if status is None:
            if self._closing:
                await Delivery(msg).nak()
            else:
                self._queue.append(msg)
                self._backoff.reset()
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
            self._open_until = loop.time() + self._expires_s + CLOSE_MARGIN_S
        else:
            body["no_wait"] = True
            self._open_until = loop.time() + NO_WAIT_LOST_S
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
        gone, and set when the next request may go: later each time, up to REFUSAL_BACKOFF_MAX_S. The count
        starts again when a message comes."""
        status, description = self._refusal or ("", "")
        self._refusal = None
        delay = self._backoff.next()
        refusals = self._backoff.attempts
        gone = status == "503" or "deleted" in description.lower()
        if refusals in (1, 10) or refusals % 100 == 0:
            log.warning("consumer %s on %s: pull request refused (%s %s)%s", self.durable, self.stream, status,
                        description, "; creating it again" if gone and self._recreate else "")
        if gone and self._recreate is not None:
            with contextlib.suppress(BusError, nats.errors.Error):
                await self._recreate()
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
        limit = min(self._open_until, loop.time() + self._expires_s + CLOSE_MARGIN_S)
        while self._open and self._nc.is_connected and await self._wait(min(limit, loop.time() + CLOSE_QUIET_S)):
            pass
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):  # closed, reconnecting or gone: nothing left to stop
                await sub.unsubscribe()


async def open_consumer(nc: Client, js: JetStreamContext, stream: str, durable: str,
                        filter_subjects: str | Sequence[str], *, ack_wait: float, max_deliver: int,
                        max_ack_pending: int, prefetch: bool) -> Consumer:
    """A durable pull consumer with explicit acks, created if absent, bound if present (`Bus.consumer`)."""
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
    return await Consumer(nc, stream, durable, prefetch=prefetch, recreate=create).start()
