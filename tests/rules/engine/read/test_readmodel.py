"""The read model: what it holds of a core, and how readers get one (fresh enough, one build shared by all)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest

from gpuevents.config import Config
from gpuevents.costs import CostModel
from gpuevents.wire.fleet import FleetNode
from rules.core.core import Core
from rules.dashboard.fleet_view import fleet_view
from rules.engine.read import readings
from rules.engine.read.readmodel import ReadModel, ReadSide, build_read_model, empty_model
from rules.engine.read.slices import Slicer
from tests.rules.helpers import T0, at, gpu, idle_core, proc, snapshot

COSTS = CostModel(Config().costs)


def fleet_core(tmp_path: Path) -> Core:
    """Nodes b (two GPUs held idle since 0 s), a (one held idle since 600 s, one busy), c in cluster x (free)."""
    core = idle_core(tmp_path)
    core.step(snapshot(at(0), "b", gpus=[gpu(0, pids=[1], idle_since=at(0)), gpu(1, pids=[2], idle_since=at(0))],
                       processes=[proc(1, gpus=[0]), proc(2, gpus=[1])]), at(0))
    core.step(snapshot(at(600), "a", gpus=[gpu(0, pids=[3], idle_since=at(600)), gpu(1, 90)], processes=[proc(3)]),
              at(600))
    core.step(snapshot(at(600), "c", gpus=[gpu(0)], cluster="x"), at(600))
    return core


async def test_the_model_holds_every_node_as_the_fleet_view_shows_it_and_ranks_incidents(tmp_path: Path) -> None:
    core = fleet_core(tmp_path)
    now = at(3600)
    model = await build_read_model(core, now, 7, COSTS, Slicer(0.0))  # a pause at every check
    snaps = [readings.node_reading(core, k) for k in readings.node_keys(core)]
    expected = fleet_view([s for s in snaps if s is not None], now, COSTS)
    assert model.version == 7 and model.node_keys == (("default", "a"), ("default", "b"), ("x", "c"))
    assert [FleetNode.model_validate_json(raw) for raw in model.node_json] == [
        n.model_copy(update={"gpus": [g.model_copy(update={"idle_for_s": model_idle(g.idle, n.name)})
                                      for g in n.gpus]}) for n in expected.nodes]
    s = model.summary
    assert (s.nodes, s.gpus, s.busy, s.idle, s.held_idle) == (3, 5, 1, 4, 3)
    assert s.held_idle_cost_per_hour == pytest.approx(expected.held_idle_cost_per_hour)
    assert (s.incidents_firing, s.incidents_pending) == (3, 0)
    top = model.top_firing(5)
    assert [i.entity_id for i in top] == ["b/gpu0", "b/gpu1", "a/gpu0"]  # held idle longest: costliest
    first, third = top[0].cost_value, top[2].cost_value
    assert first is not None and third is not None and first > third
    assert [(w.name, w.held_idle) for w in model.worst_nodes] == [("b", 2), ("a", 1)]
    nodes, incidents = model.node("a")
    assert [n.name for n in nodes] == ["a"] and [i.entity_id for i in incidents] == ["a/gpu0"]
    assert model.node("nowhere") == ([], [])


def model_idle(idle: bool, node: str) -> float | None:
    """What the read model at 3600 s says of an idle GPU's idle time: since the node's first snapshot."""
    return (3600.0 if node == "b" else 3000.0) if idle else None


class Counted:
    """A build that counts its runs, each waiting for `go` before it ends."""

    def __init__(self) -> None:
        self.version = 0
        self.builds = 0
        self.go = asyncio.Event()
        self.go.set()
        self.fail = False

    async def build(self, version: int) -> ReadModel:
        self.builds += 1
        await self.go.wait()
        if self.fail:
            raise RuntimeError("the core went away")
        return empty_model(T0 + timedelta(seconds=version), COSTS, version)


async def test_readers_share_a_build_and_get_a_model_that_saw_their_changes() -> None:
    c = Counted()
    side = ReadSide(c.build, lambda: c.version)
    c.go.clear()
    waiting = [asyncio.create_task(side.get()) for _ in range(5)]
    await asyncio.sleep(0)
    c.version = 1  # a change after the build started: a reader asking now needs another build
    late = asyncio.create_task(side.get())
    await asyncio.sleep(0)
    c.go.set()
    assert {m.version for m in await asyncio.gather(*waiting)} == {0}
    assert (await late).version == 1 and c.builds == 2
    assert (await side.get()).version == 1 and c.builds == 2  # nothing changed since: no build
    c.version = 2
    assert (await side.get(max_age_s=60)).version == 1 and c.builds == 2  # young enough for the dashboard
    assert (await side.get()).version == 2 and c.builds == 3


async def test_a_failed_build_is_raised_to_its_readers_and_the_next_reader_builds_again() -> None:
    c = Counted()
    side = ReadSide(c.build, lambda: c.version)
    c.fail = True
    with pytest.raises(RuntimeError, match="the core went away"):
        await side.get()
    c.fail = False
    assert (await side.get()).version == 0 and c.builds == 2
    side.refresh()  # after a tick: built in the background
    await side.close()
