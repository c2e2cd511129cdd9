"""The engine's store: keys escaped by the contract's `kv_token`, unchanged across versions, so a restarted engine
writes over the records it restored instead of beside them; pipelined writes that win over a stale leader's."""

from __future__ import annotations

from gpuevents.bus import Bus
from rules.core.incidents import Incident, open_incident
from rules.engine.store import ModelStore, PipelinedStore, incident_key, snooze_key
from tests.rules.engine.conftest import T0


def test_the_engines_keys_read_as_earlier_versions_wrote_them() -> None:
    assert incident_key("idle-gpu", "n1/gpu0") == "incident.idle-gpu.n1=2Fgpu0"
    assert snooze_key("hot", "node a.b%") == "snooze.hot.node=20a=2Eb=25"
    assert incident_key("", "ünï") == "incident.=.=C3=BCn=C3=AF"


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


def _incident(entity: str) -> Incident:
    return open_incident("idle", "h", entity, entity, "gpu", "c1", "n1", T0)
