"""Fleet-wide limits across partitions, against a real KV bucket: a partition writes its share counts and counts
the other partitions' windows and fresh shares (not its own, not a report too old, not an unreadable one); a bus
that does not answer leaves the last exchange in place."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuevents.bus import Bus, BusError
from gpuevents.config import Config
from gpuevents.kvstate import UNREADABLE
from rules.core.core import Core
from rules.core.limits import Elsewhere, LimitWindows, ShareCounts
from rules.engine.partitions.sharing import SHARES_MAX_AGE_S, exchange
from rules.engine.store import limits_key, shares_key
from tests.rules.helpers import T0, at, held_idle, rules_from

RULES = """\
rules:
  - name: idle
    entity: gpu
    when: gpu.idle and gpu.processes
    actions: [{type: log, message: "{{ entity.id }}"}]
"""
NOW = T0.timestamp()


def core_of(tmp_path: Path) -> Core:
    core = Core(rules_from(tmp_path, RULES), Config())
    core.step(held_idle(), at(0))
    return core


async def test_a_partition_writes_its_shares_and_counts_the_others(tmp_path: Path, bus: Bus) -> None:
    kv = await bus.kv()
    other = LimitWindows(rules={"idle": [NOW - 60]})
    await kv.put(limits_key(1), other.model_dump_json().encode())
    await kv.put(limits_key(0), LimitWindows(rules={"idle": [NOW]}).model_dump_json().encode())  # its own
    fresh = ShareCounts(by_type={"kill/process": 2}, at=NOW - 10)
    await kv.put(shares_key(1), fresh.model_dump_json().encode())
    stale = ShareCounts(by_type={"kill/process": 9}, at=NOW - SHARES_MAX_AGE_S - 1)
    await kv.put(shares_key(2), stale.model_dump_json().encode())
    unreadable = UNREADABLE.counts["shares"]
    await kv.put(shares_key(3), b"{not json")
    core = core_of(tmp_path)

    await exchange(kv, core, 0, NOW)

    assert core.limiter.elsewhere == Elsewhere(windows=[other], shares=[fresh])
    assert UNREADABLE.counts["shares"] == unreadable + 1
    entry = await kv.get(shares_key(0))
    assert entry is not None
    own = ShareCounts.model_validate_json(entry.value)
    assert own.at == NOW and own.totals["gpu"] == 2


async def test_a_bus_that_does_not_answer_keeps_the_last_exchange(tmp_path: Path, bus: Bus,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    kv = await bus.kv()
    core = core_of(tmp_path)
    before = Elsewhere(shares=[ShareCounts(by_type={"cordon/node": 1}, at=NOW)])
    core.limiter.elsewhere = before

    async def refused(key: str, value: bytes) -> int:
        raise BusError(f"updating {key} failed: NoStreamResponseError")

    monkeypatch.setattr(kv, "put", refused)
    await exchange(kv, core, 0, NOW)
    assert core.limiter.elsewhere is before
