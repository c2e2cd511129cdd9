"""`gpuevents status`'s replies: several engines' summaries merge into one (numbers added, rankings made again,
what is left out counted); an engine's error reply is a StatusError; the replies are complete once every
partition answered."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuevents.wire import ErrorReply, StatusError, StatusSummary
from gpuevents.wire.fleet import FleetIncident, FleetSummary, WorstNode
from gpuevents.wire.status import decode_reply, merge_summaries, replies_complete

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def incident(entity: str, cost: float) -> FleetIncident:
    return FleetIncident(id=entity, rule="idle-gpu", entity_id=entity, entity_kind="gpu", started_at=T0,
                         firing_since=T0, cost=f"${cost:.2f}", cost_value=cost)


def part(partition: int, held: int, costs: list[float], worst: list[tuple[str, int]]) -> StatusSummary:
    return StatusSummary(
        summary=FleetSummary(time=T0 + timedelta(seconds=partition), nodes=2, nodes_online=2, gpus=8, busy=8 - held,
                             idle=held, held_idle=held, held_idle_cost_per_hour=2.5 * held,
                             incidents_firing=len(costs)),
        incidents=[incident(f"p{partition}/gpu{i}", c) for i, c in enumerate(costs)],
        worst_nodes=[WorstNode(name=n, gpus=8, idle=h, held_idle=h) for n, h in worst],
        partition=partition, partitions=2)


def test_two_partitions_merge_into_one_summary_ranked_again() -> None:
    merged = merge_summaries([part(0, 3, [5.0, 1.0], [("a", 3)]), part(1, 1, [9.0, 2.0], [("b", 1), ("c", 4)])],
                             top=3)
    s = merged.summary
    assert (s.nodes, s.gpus, s.held_idle, s.incidents_firing) == (4, 16, 4, 4)
    assert s.held_idle_cost_per_hour == 10.0 and s.held_idle_cost_per_hour_text == "$10.00"
    assert s.time == T0 + timedelta(seconds=1)  # the later of the two
    assert [i.cost_value for i in merged.incidents] == [9.0, 5.0, 2.0]  # most costly first, across partitions
    assert merged.incidents_more == 1  # the fourth, left out by top=3
    assert [w.name for w in merged.worst_nodes] == ["c", "a", "b"]
    assert merged.partition is None and merged.partitions == 2


def test_one_partition_is_its_own_summary() -> None:
    only = part(0, 3, [5.0], [("a", 3)])
    assert merge_summaries([only]) is only


def test_an_engine_that_could_not_answer_is_a_status_error() -> None:
    raw = ErrorReply(error="the fleet moved on since the first page").model_dump_json().encode()
    with pytest.raises(StatusError, match="the fleet moved on"):
        decode_reply(raw, StatusSummary)
    ok = part(0, 1, [], []).model_dump_json().encode()
    assert decode_reply(ok, StatusSummary).summary.held_idle == 1


def test_replies_are_complete_once_every_partition_answered() -> None:
    first = part(0, 1, [], []).model_dump_json().encode()
    second = part(1, 1, [], []).model_dump_json().encode()
    assert not replies_complete([])
    assert not replies_complete([first, first])  # the same partition twice (a replica answering too)
    assert replies_complete([first, second])
