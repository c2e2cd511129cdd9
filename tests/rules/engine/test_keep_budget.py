"""A walk of the keep budget over a real nats-server: each keep says how much of the week's budget it used
("1 of 2 keeps this week"); past the owner's or the team's budget a keep is not applied and waits for the
rule's approving channel; a new week starts the count again; the weekly report's keeps carry the team."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import orjson
from nats.js import JetStreamContext

from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.clock import ManualClock
from gpuevents.config import Config
from gpuevents.events import SnapshotEvent
from gpuevents.wire import KeepReply, keep_request
from rules.engine.service import Engine
from rules.usage.keeps import KeepStore
from tests.rules.engine.conftest import IDLE_RULES, T0, snapshot
from tests.rules.engine.helpers import act_requests, publish, running
from tests.waiting import wait_for

NODES = ("n1", "n2", "n3", "n4", "n5")


def _labelled(node: str) -> SnapshotEvent:
    snap = snapshot(node, T0)
    snap.data.node.labels["team"] = "vision"
    return snap


async def _keep(bus: Bus, node: str, by: str, clock: ManualClock) -> KeepReply:
    req = keep_request("idle-gpu-1h", f"{node}/gpu0", 4 * 3600, clock.now(), by, "a demo at 3pm", keep=True)
    raw = await bus.request(S.ENGINE_SNOOZE, req.model_dump_json().encode(), timeout=5)
    return KeepReply.model_validate(orjson.loads(raw))


async def test_a_walk_of_the_keep_budget(engine_config: Config, bus: Bus, rules_dir: Path,
                                         jetstream: JetStreamContext) -> None:
    (rules_dir / "idle.yaml").write_text(IDLE_RULES.rstrip("\n") + "\n      - type: kill\n        after: 30m\n"
                                         '        approve: "#gpu-leads"\n')
    config = engine_config.model_copy(update={
        "keep_budget": engine_config.keep_budget.model_copy(update={"per_owner": 2, "owners": {"dave": 0}}),
        "teams": Config.model_validate({"teams": {"vision": {"keeps_per_week": 3}}}).teams})
    clock = ManualClock(T0)  # a Monday
    async with running(await Engine.open(config, bus, clock=clock)) as engine:
        for node in NODES:
            await publish(bus, _labelled(node))
        await wait_for(lambda: len(engine.core.state.nodes) == len(NODES),
                       what="the nodes")
        one = await _keep(bus, "n1", "alice", clock)
        two = await _keep(bus, "n2", "alice", clock)
        assert (one.budget, two.budget) == ("1 of 2 keeps this week", "2 of 2 keeps this week")
        assert one.note(4 * 3600) == "1 of 2 keeps this week" and one.until == T0 + timedelta(hours=4)
        three = await _keep(bus, "n3", "alice", clock)
        assert three.ok and three.until is None and three.approval == "#gpu-leads"
        assert three.over_budget == "alice took 2 of 2 keeps this week"
        assert three.note(4 * 3600) == ("past the keep budget (alice took 2 of 2 keeps this week): the keep "
                                        "awaits approval in #gpu-leads")
        assert ("idle-gpu-1h", "n3/gpu0") not in engine.core.snoozes
        bob = await _keep(bus, "n4", "bob", clock)  # his first; the team's third
        assert bob.budget == "1 of 2 keeps this week" and bob.until is not None
        carol = await _keep(bus, "n5", "carol", clock)
        assert carol.over_budget == "team vision took 3 of 3 keeps this week" and carol.until is None
        dave = await _keep(bus, "n5", "dave", clock)  # a budget of his own: none
        assert dave.over_budget == "dave took 0 of 0 keeps this week"
        clock.advance(7 * 86400)  # next Monday: a new week
        again = await _keep(bus, "n1", "alice", clock)
        assert again.budget == "1 of 2 keeps this week" and again.until is not None
    asked = [r for r in await act_requests(jetstream) if r.type == "keep"]
    assert [(r.entity_id, r.approve) for r in asked] == [("n3/gpu0", "#gpu-leads"), ("n5/gpu0", "#gpu-leads"),
                                                           ("n5/gpu0", "#gpu-leads")]
    assert "past the keep budget: alice took 2 of 2 keeps this week" in asked[0].params["reason"]
    with KeepStore(config.engine.usage_db) as keeps:
        rows = keeps.window(0, 2e9)
    assert sorted((r.by, r.team) for r in rows) == [("alice", "vision")] * 3 + [("bob", "vision")]
