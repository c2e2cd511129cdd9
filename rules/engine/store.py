"""Incidents and snoozes in JetStream KV: loaded before consuming, written with compare-and-set on each transition."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Generic, TypeVar

from pydantic import BaseModel

from gpuevents.bus import BusError, Kv, KvExists, KvWrongRevision
from gpuevents.kvstate import parse_or_none
from gpuevents.subjects import incident_kv_key, kv_token

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


LIMITS_KEY = "limits.windows"  # the rate-limit windows (rules.core.limits.LimitWindows), one record


def limits_key(partition: int | None) -> str:
    """Where a partition's rate-limit windows live (the whole fleet's when it is not partitioned)."""
    return LIMITS_KEY if partition is None else f"{LIMITS_KEY}.p{partition}"


def shares_key(partition: int) -> str:
    """Where a partition's fleet-share counts live, for the other partitions to count."""
    return f"shares.p{partition}"


def incident_key(rule: str, entity_id: str) -> str:
    return incident_kv_key(rule, entity_id)


def snooze_key(rule: str, entity_id: str) -> str:
    return f"snooze.{kv_token(rule)}.{kv_token(entity_id)}"


class ModelStore(Generic[M]):
    """Records of one model under one key prefix, with the revision of each remembered for CAS."""

    def __init__(self, kv: Kv, prefix: str, model: type[M]) -> None:
        self.kv = kv
        self.prefix = prefix
        self.model = model
        self._revisions: dict[str, int] = {}

    async def load(self) -> dict[str, M]:
        out: dict[str, M] = {}
        for entry in await self.kv.items(self.prefix):
            record = parse_or_none(self.model, entry, "deleting it")
            if record is None:
                try:
                    await self.kv.delete(entry.key)  # repaired: absent, as it was read
                except BusError as e:
                    log.warning("could not delete the unreadable %s (%s); it is read as absent", entry.key, e)
                continue
            out[entry.key] = record
            self._revisions[entry.key] = entry.revision
        return out

    async def save(self, key: str, record: M) -> None:
        """Write `record`; a concurrent writer is detected by its revision and then overwritten."""
        value = record.model_dump_json().encode()
        rev = self._revisions.get(key)
        try:
            if rev is None:
                self._revisions[key] = await self.kv.create(key, value)
            else:
                self._revisions[key] = await self.kv.update(key, value, last=rev)
        except (KvExists, KvWrongRevision):
            # Someone else wrote it (a previous leader's last write): ours is the newer state.
            log.warning("%s changed under us in KV; writing our state over it", key)
            current = await self.kv.get(key)
            if current is None:
                self._revisions[key] = await self.kv.create(key, value)
            else:
                self._revisions[key] = await self.kv.update(key, value, last=current.revision)

    async def delete(self, key: str) -> None:
        self._revisions.pop(key, None)
        await self.kv.delete(key)

    async def save_many(self, items: Sequence[tuple[str, M | None]]) -> None:
        """Write (key, record) pairs concurrently; a None record deletes its key."""
        await asyncio.gather(*(self.save(k, r) if r is not None else self.delete(k) for k, r in items))


class PipelinedStore(ModelStore[M]):
    """A ModelStore whose `save_many` pipelines the writes (one wait for all their acks); a write that finds
    the key changed under it (another leader's last write) takes `save`'s path: read it, write over it."""

    async def save_many(self, items: Sequence[tuple[str, M | None]]) -> None:
        if not items:
            return
        writes: list[tuple[str, bytes | None, int | None]] = []
        for key, record in items:
            if record is None:
                self._revisions.pop(key, None)
                writes.append((key, None, None))
            else:
                writes.append((key, record.model_dump_json().encode(), self._revisions.get(key)))
        results = await self.kv.write_many(writes)
        retry: list[tuple[str, M | None]] = []
        for (key, record), r in zip(items, results, strict=True):
            if isinstance(r, int):
                if record is not None:
                    self._revisions[key] = r
            elif isinstance(r, KvExists | KvWrongRevision) and record is not None:
                retry.append((key, record))
            else:
                raise r
        if retry:
            await super().save_many(retry)
