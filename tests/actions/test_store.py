"""The runner's KV keys: readable tokens escaped by the contract's `kv_token`, then a digest; unchanged across
versions, so a ledger entry, a scale's previous count or a digest is found again after an upgrade."""

from __future__ import annotations

from actions.store import kv_key


def test_the_action_keys_read_as_earlier_versions_wrote_them() -> None:
    assert kv_key("actions", "ledger", "inc-1:fire:0:0") == "actions.ledger.f303c513b7ccfe2f663a1af0"
    assert kv_key("actions", "scale", "idle-gpu", "kubernetes", "Deployment", "ml-team", "trainer") == (
        "actions.scale.idle-gpu.kubernetes.Deployment.ml-team.ea8db2b816508e0b7e192c13")
    assert kv_key("actions", "slack", "digest", "#gpu-alerts") == "actions.slack.digest.d3824b00d7a2b0b80d95c116"


def test_an_action_keys_readable_part_is_escaped_not_flattened() -> None:
    assert kv_key("actions", "scale", "ns/a", "x") != kv_key("actions", "scale", "ns_a", "x")
    assert kv_key("actions", "scale", "ns/a", "x").startswith("actions.scale.ns=2Fa.")
