"""Engine fixtures: a rule directory, a config on the test nats-server, snapshot builders."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuevents.config import Config, NatsConfig
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, SnapshotEvent, make_event

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)

IDLE_RULES = """\
rules:
  - name: idle-gpu-1h
    description: A job holds a GPU but has not used it for an hour
    entity: gpu
    when: gpu.idle and gpu.processes
    for: 1h
    actions:
      - type: log
        message: "GPU {{ gpu.index }} on {{ node.name }} idle, held by {{ gpu.owner }}"
"""


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    d = tmp_path / "rules"
    d.mkdir()
    (d / "idle.yaml").write_text(IDLE_RULES)
    return d


@pytest.fixture
def engine_config(nats_config: NatsConfig, rules_dir: Path, tmp_path: Path) -> Config:
    return Config.model_validate({
        "cluster": "c1",
        "nats": nats_config.model_dump(),
        "engine": {"rules": [str(rules_dir)], "tick": "30s", "lease_ttl": "10s",
                   "usage_db": str(tmp_path / "usage.sqlite")},
        # nodes stay online for three hours after each snapshot, so a test can jump the clock
        "agent": {"snapshot_interval": "1h"},
        "owners": {"alice": "alice@example.com"},
    })


def snapshot(node: str, at: datetime, *, util: float = 0.0, idle_since: datetime | None = None,
             pid: int | None = 4242, event_id: str | None = None) -> SnapshotEvent:
    """One node with one GPU; `pid` holds it (None: nobody)."""
    idle = util < 5
    gpu = GpuInfo(node=node, index=0, uuid=f"GPU-{node}-0", model="NVIDIA H100 80GB HBM3",
                  util_pct=util, mem_used_mib=20000, mem_total_mib=81559, idle=idle,
                  idle_since=(idle_since or at) if idle else None, pids=[pid] if pid else [])
    procs = [ProcessInfo(node=node, pid=pid, name="python", user="alice",
                         create_time=at - timedelta(hours=3), gpus=[0], gpu_mem_mib=20000)] if pid else []
    snap = NodeSnapshot(node=NodeInfo(name=node, cluster="c1", gpu_count=1), gpus=[gpu],
                        processes=procs)
    return make_event("node.snapshot", node, snap, cluster="c1", time=at, id=event_id)
