"""Reading a stream's history: every stored message on a subject from a given time, oldest first."""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Sequence
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


async def _named_consumer(js: JetStreamContext, stream: str, filter_subject: str, cfg: api.ConsumerConfig,
                          names: Sequence[str]) -> JetStreamContext.PullSubscription:
    """A pull subscription on a consumer of one of `names` not in use (the operator's login may use those only)."""
    last: Exception | None = None
    for name in random.sample(list(names), len(names)):
        cfg.name = name
        cfg.filter_subject = filter_subject
        try:
            await js.add_consumer(stream, config=cfg)  # a name in use by another reader: its config differs
        except nats.js.errors.BadRequestError as e:
            last = e
            continue
        return await js.pull_subscribe_bind(stream=stream, consumer=name)
    raise nats.js.errors.Error(f"every reader's consumer name on {stream} is in use ({last})")


async def replay(js: JetStreamContext, stream: str, filter_subject: str, since: datetime | None = None,
                 batch: int = 512, names: Sequence[str] = ()) -> AsyncIterator[StoredMsg]:
    """Every stored message of `stream` on `filter_subject` (from `since`), through an ephemeral consumer
    that acknowledges nothing and lives in memory; with `names`, one of those names, deleted after."""
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
    if names:
        sub = await _named_consumer(js, stream, filter_subject, cfg, names)
    else:
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
        if names and cfg.name:
            with contextlib.suppress(nats.errors.Error):
                await js.delete_consumer(stream, cfg.name)
