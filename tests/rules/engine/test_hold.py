"""The core behind its lock: a step waits for the commit in flight, whose failure it raises; one commit at most."""

from __future__ import annotations

import asyncio

import pytest

from gpuevents.config import Config
from rules.core.core import Core
from rules.engine.hold import CoreHold
from rules.engine.rulefiles import RuleFiles


def core(config: Config) -> Core:
    return Core(RuleFiles(config.engine.rules, config).load(), config)


def hold(config: Config) -> CoreHold:
    return CoreHold(core(config))


async def test_held_waits_for_the_commit_in_flight(engine_config: Config) -> None:
    h = hold(engine_config)
    release, order = asyncio.Event(), []

    async def commit() -> None:
        await release.wait()
        order.append("committed")

    async with h.lock:
        h.commit_behind(commit())

    async def step() -> None:
        async with h.held():
            order.append("stepped")

    stepping = asyncio.create_task(step())
    for _ in range(10):  # let it reach the lock: it must wait for the commit, however long that takes
        await asyncio.sleep(0)
    assert not stepping.done() and order == []
    release.set()
    await asyncio.wait_for(stepping, 5)
    assert order == ["committed", "stepped"]


async def test_a_failed_commit_is_raised_by_the_next_holder_and_only_once(engine_config: Config) -> None:
    h = hold(engine_config)

    async def commit() -> None:
        raise RuntimeError("KV refused the incidents")

    async with h.lock:
        h.commit_behind(commit())
    with pytest.raises(RuntimeError, match="KV refused"):
        await h.settle()
    async with h.held() as held:  # raised once: the next holder goes on
        assert held is h.core


async def test_a_second_commit_before_the_first_is_settled_is_refused(engine_config: Config) -> None:
    h = hold(engine_config)
    never = asyncio.Event()
    async with h.lock:
        h.commit_behind(never.wait())  # type: ignore[arg-type]  # a coroutine that returns a bool
        second = never.wait()
        with pytest.raises(RuntimeError, match="one commit in flight"):
            h.commit_behind(second)  # type: ignore[arg-type]
        second.close()
    never.set()
    await h.settle()


async def test_a_take_over_core_counts_as_a_change(engine_config: Config) -> None:
    h = hold(engine_config)
    before, fresh = h.changes, core(engine_config)
    h.replace(fresh)
    assert h.core is fresh and h.changes == before + 1
    assert h.describe("no-such-rule") == ""
