"""Reading a stream's history: every stored message on a subject from a given time, oldest first."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext, api

FETCH_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class StoredMsg:
    subject: str
    data: bytes
    seq: int
    time: datetime | None


async def replay(js: JetStreamContext, stream: str, filter_subject: str, since: datetime | None = None,
                 batch: int = 512) -> AsyncIterator[StoredMsg]:
    """Every stored message of `stream` on `filter_subject` (from `since`), through an ephemeral consumer
    that acknowledges nothing and lives in memory."""
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
                msgs = await sub.fetch(batch, timeout=FETCH_TIMEOUT_S)
            except (TimeoutError, nats.errors.TimeoutError):
                return
            for m in msgs:
                md = m.metadata
                yield StoredMsg(m.subject, m.data, md.sequence.stream if md.sequence else 0, md.timestamp)
            if msgs and (msgs[-1].metadata.num_pending or 0) == 0:
                return
    finally:
        with contextlib.suppress(nats.errors.Error):
            await sub.unsubscribe()
