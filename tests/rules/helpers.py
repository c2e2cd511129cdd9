"""Builders shared by the rules tests: events, configs, rule sets from YAML text, cores of common rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from pydantic import BaseModel

from gpuevents.config import Config
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, SnapshotEvent
from rules.core.core import Core
from rules.lang.loader import load_rule_set
from rules.lang.model import RuleSet

T0 = datetime(2026, 1, 5, 0, 0, tzinfo=UTC)  # a Monday
Ev = TypeVar("Ev", bound=BaseModel)


def _plain(v: object) -> object:
    if isinstance(v, BaseModel) or (isinstance(v, list) and any(isinstance(x, BaseModel) for x in v)):
        return v
    return msgspec.to_builtins(v, builtin_types=(datetime,))


def with_data(ev: Ev, **changes: object) -> Ev:
    """`ev` (an agent's event) with these fields of its `data` changed, validated as the pydantic path does: what is
    given as a model (a JobInfo someone wrote) becomes the Struct the engine keeps, as the rest of `data` is."""
    data = msgspec.to_builtins(ev.__dict__["data"], builtin_types=(datetime,))
    return type(ev).model_validate({**dict(ev), "data": {**data, **{k: _plain(v) for k, v in changes.items()}}})


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def gpu(index: int, util: float = 0.0, **kw: Any) -> GpuInfo:
    kw.setdefault("idle", util < 5)
    return GpuInfo(node=kw.pop("node", "n1"), index=index, util_pct=util, mem_total_mib=81559, **kw)


def proc(pid: int, user: str | None = "alice", gpus: list[int] | None = None, created: datetime = T0,
         **kw: Any) -> ProcessInfo:
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


IDLE = """\
rules:
  - name: idle
    entity: gpu
    when: gpu.idle and gpu.processes
    {extra}
    actions:
      - type: slack
        to: "{{{{ gpu.owner }}}}"
        text: "GPU {{{{ gpu.index }}}} held by {{{{ gpu.processes[0].name }}}} <b>"
    on_resolve:
      - type: log
        message: "{{{{ rule.name }}}} resolved on {{{{ entity.id }}}}"
"""
"""A rule on idle GPUs held by a process; `extra` adds lines to it (`for: 2m`, `limits: ...`)."""


def idle_core(tmp_path: Path, extra: str = "", cfg: Config | None = None, **kw: Any) -> Core:
    return Core(rules_from(tmp_path, IDLE.format(extra=extra)), cfg or Config(), **kw)


def held_idle(t: float = 0, util: float = 0, name: str = "train.py", **kw: Any) -> SnapshotEvent:
    """Node n1 at `t`: GPU 0 at `util` held by pid 42, GPU 1 busy."""
    return snapshot(at(t), gpus=[gpu(0, util), gpu(1, 90)], processes=[proc(42, name=name)], **kw)


SCALE = """\
rules:
  - name: scale-down
    description: {description}
    entity: gpu
    when: gpu.idle and gpu.processes
    labels: {{severity: {severity}}}
    actions: [{{type: scale, name: web, replicas: 0}}]
    on_resolve: [{{type: scale, name: web, replicas: previous}}, {{type: log, message: "{{{{ rule.description }}}}"}}]
"""
OTHER = """\
  - name: other
    entity: gpu
    when: gpu.util_pct >= 0
    actions: [{type: log, message: m}]
"""
"""SCALE: a scale-down rule whose description and label are parameters (they do not count in its hash);
OTHER: a second rule to append to it (`extra`) or to stand alone under `rules:`."""


def scale_rules(tmp_path: Path, description: str = "old words", severity: str = "info", extra: str = "") -> RuleSet:
    return rules_from(tmp_path, SCALE.format(description=description, severity=severity) + extra)


def held(t: float) -> SnapshotEvent:
    """Node n1 at `t`: GPU 0 idle, held by pid 42."""
    return snapshot(at(t), gpus=[gpu(0)], processes=[proc(42)])
