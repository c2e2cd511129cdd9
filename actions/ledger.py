"""Idempotency across restarts and runners: one KV entry per action key, claimed with compare-and-set."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from actions.store import KeyValue, kv_key
from gpuevents.bus import KvExists, KvWrongRevision
from gpuevents.kvstate import parse_or_none
from gpuevents.records import AuditRecord

log = logging.getLogger(__name__)

LedgerState = Literal["running", "retry", "deferred", "done"]
LEDGER_PREFIX = "actions.ledger."  # what kv_key("actions", "ledger", key) starts with


class LedgerEntry(BaseModel):
    """Where one action key stands. `running` past its `deadline` is taken as a dead runner's."""

    model_config = ConfigDict(frozen=True)

    key: str
    state: LedgerState
    runner: str
    since: datetime
    deadline: datetime | None = None
    attempts: int = 0
    deferrals: int = 0
    record: AuditRecord | None = None
    audited: bool = False


@dataclass(frozen=True)
class Claim:
    """The result of `claim`: `won` to run it; else `done` (it ran) or busy (another runner has it)."""

    won: bool
    entry: LedgerEntry | None
    revision: int = 0

    @property
    def done(self) -> bool:
        return self.entry is not None and self.entry.state == "done"

    @property
    def first(self) -> bool:
        """No attempt ran before this one (limits are charged once per key, here)."""
        return self.won and self.entry is not None and self.entry.attempts == 1


class Ledger:
    def __init__(self, kv: KeyValue, runner: str) -> None:
        self.kv = kv
        self.runner = runner

    @staticmethod
    def kv_key(key: str) -> str:
        return kv_key("actions", "ledger", key)

    async def read(self, key: str) -> tuple[LedgerEntry, int] | None:
        got = await self.kv.get(self.kv_key(key))
        if got is None:
            return None
        entry = parse_or_none(LedgerEntry, got, "deleting it")
        if entry is None:
            await self.kv.delete(got.key)  # repaired: absent, as it was read
            return None
        return entry, got.revision

    async def claim(self, key: str, now: datetime, deadline: datetime) -> Claim:
        """Take `key` for this runner; exactly one of several concurrent claimers wins."""
        k = self.kv_key(key)
        for _ in range(16):
            found = await self.read(key)
            if found is None:
                entry = LedgerEntry(key=key, state="running", runner=self.runner, since=now,
                                    deadline=deadline, attempts=1)
                try:
                    rev = await self.kv.create(k, entry.model_dump_json().encode())
                except KvExists:
                    continue
                return Claim(True, entry, rev)
            old, rev = found
            if old.state == "done":
                return Claim(False, old, rev)
            if old.state == "running" and old.deadline is not None and old.deadline > now:
                return Claim(False, old, rev)
            if old.state == "running":
                log.warning("action %s: runner %s did not finish by %s; taking it over",
                            key, old.runner, old.deadline)
            entry = old.model_copy(update={"state": "running", "runner": self.runner, "since": now,
                                           "deadline": deadline, "attempts": old.attempts + 1})
            try:
                new_rev = await self.kv.update(k, entry.model_dump_json().encode(), last=rev)
            except KvWrongRevision:
                continue
            return Claim(True, entry, new_rev)
        raise RuntimeError(f"could not claim action {key}: the ledger entry keeps changing")

    async def _write(self, claim: Claim, entry: LedgerEntry) -> Claim:
        k = self.kv_key(entry.key)
        try:
            rev = await self.kv.update(k, entry.model_dump_json().encode(), last=claim.revision)
        except KvWrongRevision:
            log.warning("action %s: ledger changed under runner %s; writing anyway", entry.key, self.runner)
            rev = await self.kv.put(k, entry.model_dump_json().encode())
        return Claim(claim.won, entry, rev)

    async def release(self, claim: Claim, state: Literal["retry", "deferred"]) -> Claim:
        assert claim.entry is not None
        update: dict[str, object] = {"state": state, "deadline": None}
        if state == "deferred":
            # A deferral is not a failed attempt: the next claim counts it back.
            update["deferrals"] = claim.entry.deferrals + 1
            update["attempts"] = claim.entry.attempts - 1
        return await self._write(claim, claim.entry.model_copy(update=update))

    async def finish(self, claim: Claim, record: AuditRecord) -> Claim:
        assert claim.entry is not None
        entry = claim.entry.model_copy(update={"state": "done", "deadline": None, "record": record})
        return await self._write(claim, entry)

    async def prune(self, now: datetime, keep_s: float) -> int:
        """Forget keys that finished more than `keep_s` ago (the bucket has no TTL); how many."""
        removed = 0
        for k in await self.kv.keys(LEDGER_PREFIX):
            got = await self.kv.get(k)
            if got is None:
                continue
            entry = parse_or_none(LedgerEntry, got, "deleting it")
            if entry is None or (entry.state == "done" and (now - entry.since).total_seconds() > keep_s):
                await self.kv.delete(k)
                removed += 1
        return removed

    async def mark_audited(self, claim: Claim) -> None:
        assert claim.entry is not None
        await self._write(claim, claim.entry.model_copy(update={"audited": True}))
