"""Subscriptions and request servers: handlers get a `Message` (never nats-py's Msg), answered one at a time
or, with `concurrency` above 1, each in its own task of the subscription, at most that many at once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg

from gpuevents.aio import Tasks
from gpuevents.bus.errors import bus_errors

log = logging.getLogger("gpuevents.bus")


@dataclass(frozen=True, slots=True)
class Message:
    """A message as a handler sees it: its payload, subject, headers (empty when none) and reply subject
    ("" when nobody waits for an answer)."""

    data: bytes
    subject: str
    headers: Mapping[str, str] = field(default_factory=dict)
    reply: str = ""


#: a subscriber: a message in, nothing out
Listener = Callable[[Message], Awaitable[None]]
#: a request server: a message in, the answer out (None: leave the request to others)
Handler = Callable[[Message], Awaitable[bytes | None]]


def error_reply(e: BaseException) -> bytes:
    """What a request server whose handler raised answers: `{"error": "Type: message"}`."""
    return orjson.dumps({"error": f"{type(e).__name__}: {e}"})


def _message(msg: Msg) -> Message:
    return Message(msg.data, msg.subject, dict(msg.headers) if msg.headers else {}, msg.reply or "")


class Subscription:
    """One subscription and the tasks its handler runs in; `unsubscribe` ends both."""

    def __init__(self, subject: str, listener: Listener, concurrency: int, what: str) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self.subject = subject
        self.what = what
        self._listener = listener
        self._concurrent = concurrency > 1
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks = Tasks(f"{what} on {subject}")
        self._sub: Any = None  # nats-py's subscription, once subscribed
        self.closed = False

    @property
    def in_flight(self) -> int:
        """Messages whose handler runs in a task now."""
        return len(self._tasks)

    async def open(self, nc: Client, queue: str | None) -> Subscription:
        with bus_errors(f"subscribing to {self.subject}"):
            self._sub = await nc.subscribe(self.subject, queue=queue or "", cb=self._deliver)
        return self

    async def _deliver(self, msg: Msg) -> None:
        """nats-py awaits this before it hands over the next message: one at a time, or (concurrent) until a
        slot is free and the message's task started."""
        m = _message(msg)
        if not self._concurrent:
            await self._listener(m)
            return
        await self._slots.acquire()
        try:
            self._tasks.spawn(self._in_slot(m), f"{self.what} on {m.subject}")
        except RuntimeError:  # unsubscribed meanwhile: the requester times out
            self._slots.release()

    async def _in_slot(self, m: Message) -> None:
        try:
            await self._listener(m)
        finally:
            self._slots.release()

    async def unsubscribe(self) -> None:
        """Take no more messages and cancel the handlers still running (their requesters time out)."""
        if self.closed:
            return
        self.closed = True
        try:
            if self._sub is not None:
                with bus_errors(f"unsubscribing from {self.subject}"):
                    await self._sub.unsubscribe()
        finally:
            await self._tasks.stop()

    async def drop(self) -> None:
        """Cancel the running handlers without unsubscribing (the connection is closing)."""
        self.closed = True
        await self._tasks.stop()


def answering(nc: Client, handler: Handler, what: str) -> Listener:
    """A listener that answers each request with what `handler` returns; a handler that raises answers
    `{"error": ...}` (and is logged), one that returns None leaves the request to others."""

    async def answer(m: Message) -> None:
        try:
            reply = await handler(m)
        except Exception as e:
            log.exception("%s on %s failed", what, m.subject)
            reply = error_reply(e)
        if not m.reply or reply is None:
            return
        try:  # as nats-py's Msg.respond: the request's headers go back with the answer
            await nc.publish(m.reply, reply, headers=dict(m.headers) or None)
        except Exception as e:  # the connection is down: the requester times out and retries
            log.warning("cannot answer the %s on %s: %r", what, m.subject, e)

    return answer
