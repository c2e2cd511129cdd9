"""Request/reply where each request is answered in its own task, so a slow one does not queue the rest.

nats-py awaits a subscription's callback before it hands over the next message, so a plain
`Bus.serve` handles one request at a time. A kill command can take its grace plus `KILL_WAIT_S`;
two of them for one GPU must not add up past the requester's timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson

log = logging.getLogger(__name__)

Handler = Callable[[bytes, str], Awaitable[bytes]]

#: at most this many requests of one server run at once; the rest wait for a free slot
MAX_CONCURRENT = 32


class Request(Protocol):
    """What a subscription hands over (nats-py's Msg)."""

    subject: str
    data: bytes
    reply: str

    async def respond(self, data: bytes) -> None: ...


def error_reply(e: BaseException) -> bytes:
    """What a failed handler answers, like `Bus.serve` does: `{"error": "Type: message"}`."""
    return orjson.dumps({"error": f"{type(e).__name__}: {e}"})


class ConcurrentServer:
    """Answers each request with `handler` in its own task, at most `limit` at once."""

    def __init__(self, handler: Handler, *, limit: int = MAX_CONCURRENT, what: str = "request") -> None:
        self.handler = handler
        self.what = what
        self._slots = asyncio.Semaphore(limit)
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def on_message(self, msg: Request) -> None:
        """The subscription callback: returns at once, the answer comes from the task."""
        task = asyncio.create_task(self._answer(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, msg: Request) -> None:
        async with self._slots:
            try:
                reply = await self.handler(msg.data, msg.subject)
            except Exception as e:
                log.exception("%s on %s failed", self.what, msg.subject)
                reply = error_reply(e)
        if not msg.reply:
            return
        try:
            await msg.respond(reply)
        except Exception as e:  # the connection is down: the requester times out and retries
            log.warning("cannot answer the %s on %s: %r", self.what, msg.subject, e)

    async def close(self) -> None:
        """Cancel what is still running (the agent is stopping)."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Subscriber(Protocol):
    async def subscribe(self, subject: str, handler: Callable[[Any], Awaitable[None]],
                        queue: str | None = None) -> Any: ...


async def serve_concurrently(bus: Subscriber, subject: str, handler: Handler, *,
                             limit: int = MAX_CONCURRENT, what: str = "request") -> tuple[ConcurrentServer, Any]:
    """Subscribe `subject` with a ConcurrentServer; (the server, the subscription)."""
    server = ConcurrentServer(handler, limit=limit, what=what)
    sub = await bus.subscribe(subject, server.on_message)
    return server, sub
