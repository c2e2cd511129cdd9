"""The KV bucket against a real nats-server: compare-and-set and pipelined writes."""

from __future__ import annotations

import pytest

from gpuevents.bus import Bus, KvExists, KvWrongRevision


async def test_kv_compare_and_set(bus: Bus) -> None:
    kv = await bus.kv()
    rev = await kv.create("incident.a", b"1")
    with pytest.raises(KvExists):
        await kv.create("incident.a", b"2")
    rev2 = await kv.update("incident.a", b"2", last=rev)
    with pytest.raises(KvWrongRevision):
        await kv.update("incident.a", b"3", last=rev)
    entry = await kv.get("incident.a")
    assert entry is not None and entry.value == b"2" and entry.revision == rev2
    await kv.put("incident.b", b"x")
    assert sorted(await kv.keys("incident.")) == ["incident.a", "incident.b"]
    await kv.delete("incident.a")
    assert await kv.get("incident.a") is None
    # a deleted key can be created again
    await kv.create("incident.a", b"new")


async def test_kv_write_many_creates_updates_deletes_and_refuses_stale_revisions(bus: Bus) -> None:
    kv = await bus.kv()
    first = await kv.write_many([("a", b"1", None), ("b", b"1", None)])
    assert all(isinstance(r, int) for r in first)
    rev_a, rev_b = first
    assert isinstance(rev_a, int) and isinstance(rev_b, int)
    results = await kv.write_many([("a", b"2", rev_a), ("b", b"2", None), ("b", None, None), ("c", b"2", 12345)])
    assert isinstance(results[0], int) and isinstance(results[1], KvExists) and isinstance(results[2], int)
    assert isinstance(results[3], KvWrongRevision)
    a = await kv.get("a")
    assert a is not None and a.value == b"2" and a.revision == results[0]
    assert await kv.get("b") is None and await kv.get("c") is None
