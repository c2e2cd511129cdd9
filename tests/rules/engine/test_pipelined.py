"""Pipelined JetStream publishes and KV writes (what the engine commits a batch with), against a real nats-server."""

from __future__ import annotations

from gpuevents import subjects as S
from gpuevents.bus import Bus, BusNoResponders, KvExists, KvWrongRevision, PublishItem
from gpuevents.records import AuditRecord
from rules.core.incidents import Incident, open_incident
from rules.engine.store import ModelStore, PipelinedStore

from .conftest import T0


async def test_publish_many_stores_each_once_in_order_and_reports_failures_per_item(bus: Bus) -> None:
    records = [AuditRecord(time=T0, kind="reload", detail=f"r{i}") for i in range(5)]
    items = [PublishItem(S.audit_subject("engine"), r.model_dump_json().encode(), msg_id=r.id) for r in records]
    items.insert(2, PublishItem("no.stream.here", b"x"))
    results = await bus.js_publish_many(items)
    assert isinstance(results[2], BusNoResponders)
    seqs = [r for i, r in enumerate(results) if i != 2]
    assert all(isinstance(s, int) for s in seqs) and seqs == sorted(seqs) and len(set(seqs)) == 5
    again = await bus.js_publish_many(items[:2])  # the same msg ids: deduplicated, the same sequences
    assert again == seqs[:2]
    stored = await bus.stored(S.STREAM_AUDIT)
    assert [AuditRecord.model_validate_json(m.data).detail for m in stored] == [f"r{i}" for i in range(5)]
    assert await bus.js_publish_many([]) == []


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


def _incident(entity: str) -> Incident:
    return open_incident("idle", "h", entity, entity, "gpu", "c1", "n1", T0)


async def test_pipelined_store_writes_over_a_previous_leaders_write_like_save_does(bus: Bus) -> None:
    kv = await bus.kv()
    ours = PipelinedStore(kv, "incident.", Incident)
    theirs = ModelStore(kv, "incident.", Incident)
    a, b = _incident("n1/gpu0"), _incident("n1/gpu1")
    await ours.save_many([("incident.a", a), ("incident.b", b)])
    await theirs.load()
    await theirs.save("incident.a", b)  # another writer moved the key on
    await kv.delete("incident.b")  # and deleted the other: a create over a delete marker
    fired = a.model_copy(update={"status": "firing"})
    await ours.save_many([("incident.a", fired), ("incident.b", b)])
    loaded = await ModelStore(kv, "incident.", Incident).load()
    assert loaded == {"incident.a": fired, "incident.b": b}
    await ours.save_many([("incident.a", None)])
    assert set(await ModelStore(kv, "incident.", Incident).load()) == {"incident.b"}
