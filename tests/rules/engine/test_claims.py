"""Two agents claiming one node are found when their snapshots take turns; one agent replacing another is not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from msgspec.structs import replace

from gpuevents.events import AgentInfo, Event, SnapshotEvent, make_event
from rules.engine.claims import NodeClaims
from tests.rules.engine.conftest import snapshot
from tests.rules.helpers import with_data

T0 = datetime(2026, 12, 3, 15, 0, tzinfo=UTC)


def from_agent(agent_id: str, s: float, node: str = "vm", pid: int | None = None) -> Event:
    ev = snapshot(node, T0 + timedelta(seconds=s))
    assert isinstance(ev, SnapshotEvent)
    return with_data(ev, node=replace(ev.data.node, agent_id=agent_id, hostname="vm"))


def see_all(claims: NodeClaims, *events: tuple[Event, float]) -> list[str]:
    return [c.text() for ev, s in events if (c := claims.see(ev, T0 + timedelta(seconds=s))) is not None]


def test_agents_taking_turns_on_one_node_are_reported_once() -> None:
    claims = NodeClaims(window_s=60)
    found = see_all(claims, *[(from_agent("up-agent-aaaa1111" if i % 2 == 0 else "sim-agent-bbbb2222", i * 5), i * 5)
                              for i in range(8)])
    assert len(found) == 1
    assert found[0].startswith("node vm (cluster c1) is claimed by 2 agents: aaaa1111 (host vm); bbbb2222 (host vm)")
    assert "give each agent its own agent.node_name" in found[0]
    [now] = claims.conflicts(T0 + timedelta(seconds=40))
    assert now.node == "vm" and len(now.agents) == 2


def test_an_agent_replaced_by_a_restarted_one_is_not_a_conflict() -> None:
    claims = NodeClaims(window_s=60)
    assert see_all(claims, *[(from_agent("old-11111111", s), s) for s in (0, 15, 30)],
                   *[(from_agent("new-22222222", s), s) for s in (45, 60, 75)]) == []
    assert claims.conflicts(T0 + timedelta(seconds=80)) == []


def test_a_stopping_agent_hands_the_node_over_and_old_claims_expire() -> None:
    claims = NodeClaims(window_s=60)
    see_all(claims, (from_agent("a-11111111", 0), 0), (from_agent("b-22222222", 5), 5))
    stopping = make_event("agent.stopping", "vm", AgentInfo(node="vm", agent_id="a-11111111"), cluster="c1",
                          time=T0 + timedelta(seconds=6))
    assert claims.see(stopping, T0 + timedelta(seconds=6)) is None
    assert see_all(claims, (from_agent("b-22222222", 10), 10)) == []
    assert claims.conflicts(T0 + timedelta(seconds=10)) == []


def test_nodes_with_an_agent_each_are_fine_and_agents_without_ids_are_ignored() -> None:
    claims = NodeClaims(window_s=60)
    assert see_all(claims, *[(from_agent(f"agent-{n}", i, node=n), i) for i in range(6) for n in ("n1", "n2")]) == []
    assert claims.see(snapshot("vm", T0), T0) is None  # no agent_id: an agent from before ids
