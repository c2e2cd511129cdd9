"""The idempotency ledger and the fleet-wide hourly limit, on the in-memory store (same CAS semantics)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from actions.ledger import Ledger
from actions.store import MemoryKv
from gpuevents.bus import Bus
from gpuevents.kvstate import UNREADABLE
from gpuevents.records import AuditRecord
from tests.actions.conftest import T0


async def test_only_one_of_many_concurrent_claims_wins() -> None:
    kv = MemoryKv()
    ledgers = [Ledger(kv, f"r{i}") for i in range(5)]
    claims = await asyncio.gather(*(lg.claim("k", T0, T0 + timedelta(seconds=60)) for lg in ledgers))
    assert sum(c.won for c in claims) == 1


async def test_a_dead_runners_claim_is_taken_over_after_its_deadline() -> None:
    kv = MemoryKv()
    dead, alive = Ledger(kv, "dead"), Ledger(kv, "alive")
    assert (await dead.claim("k", T0, T0 + timedelta(seconds=60))).won
    assert not (await alive.claim("k", T0 + timedelta(seconds=30), T0 + timedelta(seconds=90))).won
    late = await alive.claim("k", T0 + timedelta(seconds=61), T0 + timedelta(seconds=121))
    assert late.won and late.entry is not None and late.entry.attempts == 2 and late.entry.runner == "alive"


async def test_done_is_final_and_deferrals_are_not_attempts() -> None:
    kv = MemoryKv()
    lg = Ledger(kv, "r")
    first = await lg.claim("k", T0, T0 + timedelta(seconds=60))
    await lg.release(first, "deferred")
    again = await lg.claim("k", T0, T0 + timedelta(seconds=60))
    assert again.won and again.entry is not None and again.entry.attempts == 1 and again.entry.deferrals == 1
    record = AuditRecord(time=T0, kind="action", outcome="ok", action_key="k")
    await lg.finish(again, record)
    done = await lg.claim("k", T0 + timedelta(hours=1), T0 + timedelta(hours=2))
    assert not done.won and done.done and done.entry is not None and done.entry.record == record


async def test_prune_forgets_only_keys_finished_long_ago() -> None:
    kv = MemoryKv()
    lg = Ledger(kv, "r")
    for key, at in (("old", T0), ("new", T0 + timedelta(days=6))):
        claim = await lg.claim(key, at, at + timedelta(minutes=1))
        await lg.finish(claim, AuditRecord(time=at, kind="action", outcome="ok", action_key=key))
    running = await lg.claim("busy", T0, T0 + timedelta(days=30))
    assert running.won
    assert await lg.prune(T0 + timedelta(days=8), keep_s=7 * 86400) == 1
    assert await lg.read("old") is None and await lg.read("new") is not None and await lg.read("busy") is not None


async def test_an_unreadable_entry_in_the_real_bucket_is_read_as_absent_counted_and_replaced(bus: Bus) -> None:
    """Before: LedgerEntry's ValidationError ended the runner's attempt at the action, every time."""
    kv = await bus.kv()
    await kv.put(Ledger.kv_key("k1"), b"not json")
    before = UNREADABLE.counts["ledger"]
    claim = await Ledger(kv, "r1").claim("k1", T0, T0 + timedelta(seconds=30))
    assert claim.won
    found = await Ledger(kv, "r2").read("k1")
    assert found is not None and found[0].runner == "r1"
    assert UNREADABLE.counts["ledger"] == before + 1
