"""Builders shared by the rules tests: events, configs, rule sets from YAML text."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpuevents.config import Config
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, SnapshotEvent
from rules.lang.loader import load_rule_set
from rules.lang.model import RuleSet

T0 = datetime(2026, 1, 5, 0, 0, tzinfo=UTC)  # a Monday


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def gpu(index: int, util: float = 0.0, **kw: Any) -> GpuInfo:
    kw.setdefault("idle", util < 5)
    return GpuInfo(node=kw.pop("node", "n1"), index=index, util_pct=util, mem_total_mib=81559, **kw)


def proc(pid: int, user: str = "alice", gpus: list[int] | None = None, created: datetime = T0, **kw: Any) -> ProcessInfo:
    return ProcessInfo(node=kw.pop("node", "n1"), pid=pid, user=user, gpus=gpus if gpus is not None else [0],
                       create_time=created, **kw)


def snapshot(t: datetime, node: str = "n1", gpus: list[GpuInfo] | None = None,
             processes: list[ProcessInfo] | None = None, labels: dict[str, str] | None = None,
             cluster: str = "default") -> SnapshotEvent:
    return SnapshotEvent(
        source=f"node/{node}", cluster=cluster, time=t,
        data=NodeSnapshot(node=NodeInfo(name=node, cluster=cluster, labels=labels or {}),
                          gpus=[g.model_copy(update={"node": node}) for g in (gpus or [])],
                          processes=[p.model_copy(update={"node": node}) for p in (processes or [])]),
    )


def rules_from(tmp_path: Path, text: str, name: str = "rules.yaml", timezone: str = "UTC") -> RuleSet:
    f = tmp_path / name
    f.write_text(text)
    return load_rule_set([f], default_timezone=timezone)


def config(**engine: Any) -> Config:
    return Config.model_validate({"engine": engine})
