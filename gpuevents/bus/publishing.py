"""Publishing to JetStream: the non-blocking event buffer agents publish through, single publishes, and
pipelined ones (all sent, then their acks awaited together)."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from gpuevents.aio import Backoff, wait_any
from gpuevents.bus.errors import BusError, BusNoResponders, BusStoreFull, BusTimeout, ack_error, store_full

log = logging.getLogger("gpuevents.bus")

PUBLISH_BATCH = 256  # buffered events sent together, their acks awaited together


@dataclass
class BusStats:
    published: int = 0
    dropped: int = 0
    reconnects: int = 0
    disconnects: int = 0
    publish_retries: int = 0
    buffered: int = 0


@dataclass(frozen=True)
class PublishItem:
    """One message for `Bus.js_publish_many`."""

    subject: str
    payload: bytes
    msg_id: str | None = None
    headers: dict[str, str] | None = None


class AckPipe:
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


def msg_headers(msg_id: str | None, headers: dict[str, str] | None) -> dict[str, str] | None:
    out = dict(headers or {})
    if msg_id:
        out["Nats-Msg-Id"] = msg_id
    return out or None


async def js_publish(js: JetStreamContext, subject: str, payload: bytes, *, msg_id: str | None,
                     timeout: float, headers: dict[str, str] | None = None) -> int:
    """Publish to JetStream and wait for the ack; the stream sequence, or BusError."""
    try:
        ack = await js.publish(subject, payload, headers=msg_headers(msg_id, headers), timeout=timeout)
    except nats.js.errors.NoStreamResponseError:
        raise BusNoResponders(f"no stream stores {subject}") from None
    except (TimeoutError, nats.errors.TimeoutError):
        raise BusTimeout(f"JetStream publish to {subject} timed out") from None
    except nats.js.errors.APIError as e:
        cls = BusStoreFull if store_full(getattr(e, "err_code", None), getattr(e, "description", None)) else BusError
        raise cls(f"JetStream publish to {subject} failed: {e}") from e
    except nats.errors.Error as e:
        raise BusError(f"JetStream publish to {subject} failed: {e}") from e
    return int(ack.seq)


async def js_publish_many(pipe: AckPipe, items: Sequence[PublishItem], timeout: float) -> list[int | BusError]:
    """Per item, in order: its stream sequence, or the BusError `js_publish` would have raised."""
    if not items:
        return []
    prepared = [(it.subject, it.payload, msg_headers(it.msg_id, it.headers)) for it in items]
    results = await pipe.publish(prepared, timeout)
    out: list[int | BusError] = []
    for it, r in zip(items, results, strict=True):
        err = ack_error(r, f"JetStream publish to {it.subject}")
        if err is None:
            assert isinstance(r, dict)
            out.append(int(r["seq"]))
        else:
            out.append(err)
    return out


class EventBuffer:
    """Events waiting for JetStream: `add` never blocks (the oldest is dropped when full); a background
    `run` sends them in batches while connected and puts back what failed, retrying with backoff."""

    def __init__(self, limit: int, stats: BusStats, js: Callable[[], JetStreamContext],
                 connected: Callable[[], bool], timeout: float) -> None:
        self.limit = limit
        self.stats = stats
        self._js = js
        self._connected = connected
        self._timeout = timeout
        self._items: collections.deque[tuple[str, bytes, str]] = collections.deque()
        self.wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return len(self._items)

    def add(self, subject: str, payload: bytes, msg_id: str) -> None:
        if self.limit and len(self._items) >= self.limit:
            self._items.popleft()
            self.stats.dropped += 1
            if self.stats.dropped == 1 or self.stats.dropped % 1000 == 0:
                log.warning("publish buffer full (%d); dropped %d events so far", self.limit, self.stats.dropped)
        self._items.append((subject, payload, msg_id))
        self.stats.buffered = len(self._items)
        self._idle.clear()
        self.wake.set()

    async def flush(self, timeout: float) -> bool:
        """Wait until every buffered event is stored; False if `timeout` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    async def run(self) -> None:
        backoff = Backoff(0.2, 4.0)  # in [0.1, 0.2] s at first, [2, 4] s at most, while NATS recovers
        while True:
            if not self._items:
                self._idle.set()
                self.wake.clear()
                await self.wake.wait()
                continue
            if not self._connected():
                self.wake.clear()
                await wait_any(self.wake, timeout=1.0)
                continue
            batch = [self._items.popleft() for _ in range(min(PUBLISH_BATCH, len(self._items)))]
            results = await asyncio.gather(*(self._publish_one(s, p, i) for s, p, i in batch), return_exceptions=True)
            failed = [item for item, r in zip(batch, results, strict=True) if r is not None]
            self.stats.published += len(batch) - len(failed)
            if failed:
                self.stats.publish_retries += len(failed)
                self._items.extendleft(reversed(failed))
                self.stats.buffered = len(self._items)
                await backoff.sleep()
            else:
                backoff.reset()
            self.stats.buffered = len(self._items)

    async def _publish_one(self, subject: str, payload: bytes, msg_id: str) -> Exception | None:
        try:
            await self._js().publish(subject, payload, headers={"Nats-Msg-Id": msg_id}, timeout=self._timeout)
            return None
        except (TimeoutError, nats.errors.Error, BusError, OSError) as e:
            return e
