"""Liveness keeps each node's deadline in a lazy heap: it answers what a walk over every node answers, and a tick
or a wakeup with nothing due walks no node.

Random fleets (`differential_inputs`: snapshots, repeats, agents stopping and starting with new intervals, nodes
forgotten, ticks; time passing as the engine lets it or in jumps, offline detection on or off) are fed to two
cores: ours, and one whose liveness walks every node at each tick and wakeup (the code before the heap). After
every step they must agree on the result, in order, and on every node's online state; and `next_change` at
instants around the step (earlier ones too: "what is due is left to the tick" must hold whichever way the question
moves) must be the walk's answer.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rules.core.core import Core, Tick
from rules.core.inputs import StepResult
from tests.quick import examples
from tests.rules.core.differential_inputs import Item, inputs
from tests.rules.core.test_differential import _rules, _run
from tests.rules.helpers import at, config, gpu, rules_from, snapshot

EXAMPLES = int(os.environ.get("GPUEVENTS_PROPERTY_EXAMPLES", "150"))


def _core(tmp_path: Path, detection: bool) -> Core:
    return Core(_rules(tmp_path, 0), config(tick="30s", offline_grace="2m"), offline_detection=detection)


def _walking(core: Core) -> Core:
    """The core with its liveness walking every node, as before the heap."""
    lv = core.liveness
    lv.check_nodes = lv.walk_check_nodes  # type: ignore[method-assign]
    lv.next_change = lv.walk_next_change  # type: ignore[method-assign]
    return core


def _result(out: StepResult) -> dict[str, Any]:
    return {
        "transitions": [(tr.time, tr.rule, tr.entity_key, tr.from_status, tr.to_status, tr.reason)
                        for tr in out.transitions],
        "incidents": [str(sorted(i.model_dump().items())) for i in out.incidents],
        "actions": [(a.key, a.type, a.rule, a.entity_id, a.phase, a.decision, str(a.params)) for a in out.actions],
    }


def _nodes(core: Core) -> list[tuple[str, bool, datetime | None, datetime | None]]:
    return [(k, ns.online, ns.offline_since, ns.last_seen) for k, ns in core.state.nodes.items()]


def _step(ours: Core, ref: Core, item: Item, now: datetime, probes: list[float]) -> None:
    assert _result(_run(ours, item, now)) == _result(_run(ref, item, now)), (now, item)
    assert _nodes(ours) == _nodes(ref), (now, item)
    for dt in probes:
        q = now + timedelta(seconds=dt)
        assert ours.liveness.next_change(q) == ref.liveness.walk_next_change(q), (now, item, dt)
    assert ours.next_wakeup(now) == ref.next_wakeup(now), (now, item)


@settings(max_examples=examples(EXAMPLES), deadline=None, derandomize=not os.environ.get("GPUEVENTS_PROPERTY_EXAMPLES"),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(items=inputs(), detection=st.booleans(), wake=st.booleans(), back=st.booleans(),
       one_pass=st.sampled_from([8, 0]),
       probes=st.lists(st.sampled_from([-400.0, -45.0, -15.0, 0.0, 0.0, 30.0, 45.0, 120.0, 900.0]), max_size=4))
def test_the_heap_answers_what_the_walk_answers(
    tmp_path: Path, items: list[tuple[float, Item]], detection: bool, wake: bool, back: bool, one_pass: int,
    probes: list[float],
) -> None:
    for v in range(3):
        _rules(tmp_path, v)
    ours, ref = _core(tmp_path, detection), _walking(_core(tmp_path, detection))
    ours.liveness.one_pass_share = one_pass  # a small fleet: due nodes in one pass, or (0) sorted in the fleet's order
    last = at(0)
    for t, item in items:
        now = at(t)
        while wake and (w := ours.next_wakeup(last)) <= now:  # else: many nodes due at the next tick
            assert w == ref.next_wakeup(last)
            _step(ours, ref, Tick(), w, probes)
            last = w
        _step(ours, ref, item, now, probes)
        if back and isinstance(item, Tick):  # a clock that went back: a tick earlier than the last step
            _step(ours, ref, Tick(sweep=False), now - timedelta(seconds=50), probes)
        last = now
    assert _nodes(ours) == _nodes(ref)


class _Counting(dict):  # type: ignore[type-arg]
    """A node table that counts the walks over it."""

    walks = 0

    def _walked(self) -> None:
        type(self).walks += 1

    def __iter__(self) -> Any:
        self._walked()
        return super().__iter__()

    def items(self) -> Any:
        self._walked()
        return super().items()

    def values(self) -> Any:
        self._walked()
        return super().values()


IDLE = """\
rules:
  - name: agent-down
    entity: node
    when: not node.online
    actions: [{type: log, message: down}]
"""


def test_a_tick_with_nothing_due_walks_no_node(tmp_path: Path) -> None:
    core = Core(rules_from(tmp_path, IDLE), config(tick="30s", offline_grace="2m"))  # snapshots every 15 s
    nodes = _Counting()
    core.state.nodes = nodes
    for i in range(50):
        core.step(snapshot(at(0), f"n{i}", gpus=[gpu(0)]), at(0))
    # every node offline 45 s after its last word, gone 2 min later
    assert core.liveness.next_change(at(1)) == at(45)
    _Counting.walks = 0
    assert core.step(Tick(), at(10)).transitions == []
    assert core.next_wakeup(at(10)) <= at(40)
    assert _Counting.walks == 0
    for i in range(1, 50):  # all but n0 report again
        core.step(snapshot(at(30), f"n{i}", gpus=[gpu(0)]), at(30))
    assert core.liveness.next_change(at(31)) == at(45)
    out = core.step(Tick(), at(45))
    assert [(tr.entity_key, tr.to_status) for tr in out.transitions] == [("n0", "pending"), ("n0", "firing")]
    assert core.liveness.next_change(at(46)) == at(75)
    assert _Counting.walks == 0
    # the walk it replaced does walk
    core.liveness.walk_next_change(at(46))
    assert _Counting.walks == 1
