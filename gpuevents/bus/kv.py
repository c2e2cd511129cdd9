"""A JetStream key-value bucket: get, put, compare-and-set (`create`, `update(last=)`), pipelined writes, scans."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from gpuevents.aio import guarded_task
from gpuevents.bus.errors import BusError, BusTimeout, KvExists, KvWrongRevision, ack_error, bus_errors
from gpuevents.bus.publishing import AckPipe

SCAN_CONSUMER_TTL_S = 10.0
SCAN_SETTLE_S = 0.05  # after nats-py's "initial values done" marker, entries still on their way get this long


@dataclass(frozen=True)
class KvEntry:
    key: str
    value: bytes
    revision: int


class Kv:
    """A JetStream key-value bucket; `create` and `update(last=)` are the compare-and-set tools."""

    def __init__(self, kv: KeyValue, bucket: str, pipe: AckPipe | None = None,
                 js: JetStreamContext | None = None) -> None:
        self._kv = kv
        self._pipe = pipe
        self._js = js
        self._stream = f"KV_{bucket}"
        self._subjects = f"$KV.{bucket}."  # where JetStream keeps the bucket's keys

    async def get(self, key: str) -> KvEntry | None:
        try:
            with bus_errors(f"reading {key}"):
                e = await self._kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        if e.value is None:
            return None
        return KvEntry(key, e.value, e.revision or 0)

    async def stored_at(self, revision: int) -> datetime | None:
        """When the server stored `revision` (by the server's clock: the shared time source of DESIGN §7.1);
        None when that revision is gone already (written over) or the bucket was opened without JetStream."""
        if self._js is None:
            return None
        try:
            with bus_errors("reading when a KV value was stored"):
                msg = await self._js.get_msg(self._stream, seq=revision)
        except nats.js.errors.NotFoundError:
            return None
        return msg.time

    async def put(self, key: str, value: bytes) -> int:
        with bus_errors(f"writing {key}"):
            return int(await self._kv.put(key, value))

    async def create(self, key: str, value: bytes) -> int:
        try:
            with bus_errors(f"creating {key}"):
                return int(await self._kv.create(key, value))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise KvExists(key) from None
        except nats.js.errors.APIError as e:
            if e.err_code == 10071:  # wrong last sequence
                raise KvExists(key) from None
            raise

    async def update(self, key: str, value: bytes, last: int) -> int:
        try:
            with bus_errors(f"updating {key}"):
                return int(await self._kv.update(key, value, last=last))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise KvWrongRevision(key) from None
        except nats.js.errors.APIError as e:
            if e.err_code == 10071:
                raise KvWrongRevision(key) from None
            raise

    async def delete(self, key: str) -> None:
        try:
            with bus_errors(f"deleting {key}"):
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
        pre = self._subjects
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
            err = ack_error(r, f"KV write of {key}")
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
        with bus_errors(f"listing keys under {prefix!r}"):
            # A scan's ordered consumer is gone 10 s after it stops (nats-py's default, 5 min, leaves hundreds
            # of them on the servers' meta layer when partitions scan every few seconds).
            watcher = await _watch(self._kv.watch(f"{prefix}>" if prefix else ">", ignore_deletes=True,
                                                  meta_only=meta_only, inactive_threshold=SCAN_CONSUMER_TTL_S))
        out: list[KvEntry] = []
        last_seen = False  # an entry with nothing pending after it came: the scan is complete
        marker = False
        try:
            while not last_seen:
                try:
                    # nats-py's "initial values done" marker (None) can come before entries still on their way
                    # (it checks the consumer's pending count against what its callback has processed): after
                    # it, wait briefly for them unless the last entry has been seen.
                    e = await watcher.updates(timeout=SCAN_SETTLE_S if marker else 30.0)
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
            await _stop(watcher)
        return out


# nats-py starts a watch's heartbeat and flow-control tasks before `watch` returns it, and ends them only at the
# end of its `stop`: a scan cancelled half-way through either (an engine stopping) left them running for as long
# as the connection. Both are seen through to their end, then the cancel goes on.

async def _watch(making: Coroutine[Any, Any, KeyValue.KeyWatcher]) -> KeyValue.KeyWatcher:
    task = guarded_task(making, "KV scan watch", awaited=True)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await _stop(await task)
        raise


async def _stop(watcher: KeyValue.KeyWatcher) -> None:
    task = guarded_task(watcher.stop(), "KV scan stop", awaited=True)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task
        raise


async def open_bucket(js: JetStreamContext, bucket: str, replicas: int, pipe: AckPipe) -> Kv:
    """The bucket, created when absent (history 1)."""
    try:
        handle = await js.key_value(bucket)
    except nats.js.errors.BucketNotFoundError:
        handle = await js.create_key_value(bucket=bucket, history=1, replicas=replicas,
                                           description="gpuevents: incidents, snoozes, leases, idempotency keys")
    return Kv(handle, bucket, pipe, js)
