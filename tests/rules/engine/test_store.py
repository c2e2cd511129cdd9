"""The engine's KV keys: incidents and snoozes under keys escaped by the contract's `kv_token`, unchanged
across versions, so a restarted engine writes over the records it restored instead of beside them."""

from __future__ import annotations

from rules.engine.store import incident_key, snooze_key


def test_the_engines_keys_read_as_earlier_versions_wrote_them() -> None:
    assert incident_key("idle-gpu", "n1/gpu0") == "incident.idle-gpu.n1=2Fgpu0"
    assert snooze_key("hot", "node a.b%") == "snooze.hot.node=20a=2Eb=25"
    assert incident_key("", "ünï") == "incident.=.=C3=BCn=C3=AF"
