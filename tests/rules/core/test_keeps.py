"""A keep past snooze_max: the channel that approves it, the request it asks, the GPUs a kept entity holds."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from gpuevents.wire import keep_request
from rules.core.core import Core
from rules.core.keeps import approving_channel, entity_gpus, keep_approval
from tests.rules.helpers import T0, at, gpu, proc, rules_from, snapshot

RULES = """\
rules:
  - name: warned
    entity: gpu
    when: gpu.idle
    actions:
      - type: log
        message: idle
      - type: kill
        after: 1h
        approve: "#gpu-leads"
        approve_within: 2h
  - name: plain
    entity: process
    when: "true"
    snooze_max: 8h
    actions:
      - type: log
        message: hi
"""


def test_the_approving_channel_is_the_rules_approve_and_the_request_asks_for_the_whole_keep(tmp_path: Path) -> None:
    rules = rules_from(tmp_path, RULES)
    assert approving_channel(rules.by_name["warned"]) == ("#gpu-leads", 7200.0)
    assert approving_channel(rules.by_name["plain"]) is None
    ask = keep_request("warned", "n1/gpu0", 3 * 86400, T0, "alice", "fine-tune", keep=True)
    req = keep_approval(rules.by_name["warned"], ask, "#gpu-leads", 7200.0, "gpu", "c1", "n1", T0, "abc")
    assert (req.key, req.type, req.approve, req.approve_within, req.destructive) == (
        "keep:abc", "keep", "#gpu-leads", 7200.0, False)
    assert req.params == {"type": "keep", "until": (T0 + timedelta(days=3)).isoformat(), "by": "alice",
                          "asked_reason": "fine-tune", "reason": "alice asks to keep it until 2026-01-08 00:00 UTC "
                          "(3d; the rule allows 1d): fine-tune"}


def test_a_kept_entitys_gpus(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, RULES), offline_detection=False)
    core.step(snapshot(at(0), gpus=[gpu(0), gpu(1), gpu(2, 90)], processes=[proc(7, gpus=[0, 1])]), at(0))
    [g] = core.state.entities_by_id("gpu", "n1/gpu1")
    [p] = core.state.entities_by_id("process", "n1/pid7")
    [n] = core.state.entities_by_id("node", "n1")
    assert entity_gpus(g) == [("n1", 1)]
    assert entity_gpus(p) == [("n1", 0), ("n1", 1)]
    assert entity_gpus(n) == [("n1", 0), ("n1", 1), ("n1", 2)]
