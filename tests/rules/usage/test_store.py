"""The usage database on disk: a deleted or replaced file is noticed, said in the log, and written again."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from pathlib import Path

import pytest

from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, SnapshotEvent, make_event
from rules.usage.rollup import UsageAggregator, UsageBatch
from rules.usage.store import UsageStore
from tests.rules.dashboard.fleetday import DAY_START


def batch(node: str, seconds: float = 10) -> UsageBatch:
    """`seconds` of one busy GPU on `node`."""
    agg = UsageAggregator(snapshot_interval=15, rated_power_w=lambda _m: 400.0)
    snap = NodeSnapshot(node=NodeInfo(name=node), gpus=[GpuInfo(node=node, index=0, util_pct=50)])
    event: SnapshotEvent = make_event("node.snapshot", node, snap, time=DAY_START)  # type: ignore[assignment]
    agg.observe(event, event.time)
    agg.settle(DAY_START + timedelta(seconds=seconds))
    return agg.drain()


def nodes_in(path: Path) -> dict[str, float]:
    """Busy seconds per node, as a report reading the file at `path` sees them."""
    with UsageStore(path) as reader:
        return {r.node: r.busy_s for r in reader.usage(0, 2**40)}


def test_a_deleted_database_is_created_again_written_and_logged(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "usage.sqlite"
    with UsageStore(path) as store:
        store.add(batch("before"))
        os.unlink(path)
        store.add(batch("after"))
        assert path.exists()
        assert nodes_in(path) == {"after": pytest.approx(10)}  # not into the unlinked file any more
    (line,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert f"the usage database {path} was deleted: a new, empty one is created" in line.getMessage()


def test_a_replaced_database_is_used_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, restored = tmp_path / "usage.sqlite", tmp_path / "restored.sqlite"
    with UsageStore(restored) as backup:
        backup.add(batch("from-backup"))
    with UsageStore(path) as store:
        store.add(batch("old"))
        os.replace(restored, path)  # an operator restores a backup under the same name
        store.add(batch("new"))
        assert {r.node for r in store.usage(0, 2**40)} == {"from-backup", "new"}
    assert set(nodes_in(path)) == {"from-backup", "new"}
    assert any("was replaced: the new file is used" in r.getMessage() for r in caplog.records)


def test_an_untouched_database_is_not_reopened(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "usage.sqlite"
    with UsageStore(path) as store:
        store.add(batch("a"))
        store.add(batch("b"))
        store.prune(0)
    assert set(nodes_in(path)) == {"a", "b"} and not caplog.records
