"""Scenario files for the simulated sampler: a job mix with durations, a time speed-up, pinned jobs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpuevents.durations import parse_duration
from gpuevents.yamlpos import Located, LocatedError, parse_yaml, read_yaml_text

SCENARIO_DIR = Path(__file__).with_name("scenarios")

JobKindName = Literal["training", "idle_holder", "forgotten", "ghost"]


def _span(value: Any) -> Any:
    """`2h` or `[30m, 4h]`: a (low, high) pair; durations as strings or numbers."""
    if isinstance(value, list | tuple):
        if len(value) != 2:
            raise ValueError("must be a value or a [low, high] pair")
        lo, hi = value
    else:
        lo = hi = value
    return (lo, hi)


def _dur(value: Any) -> float:
    return parse_duration(value)


def _duration_span(value: Any) -> tuple[float, float]:
    lo, hi = _span(value)
    a, b = _dur(lo), _dur(hi)
    if a > b:
        raise ValueError(f"low {lo!r} is above high {hi!r}")
    return (a, b)


def _number_span(value: Any) -> tuple[float, float]:
    lo, hi = _span(value)
    a, b = float(lo), float(hi)
    if a > b:
        raise ValueError(f"low {lo!r} is above high {hi!r}")
    return (a, b)


DurationSpan = Annotated[tuple[float, float], BeforeValidator(_duration_span)]
NumberSpan = Annotated[tuple[float, float], BeforeValidator(_number_span)]
Seconds = Annotated[float, BeforeValidator(_dur)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobMix(_Model):
    """One kind of job in the mix and how it behaves."""

    kind: JobKindName
    weight: float = Field(1.0, gt=0)
    duration: DurationSpan = (1800.0, 14400.0)
    util_pct: NumberSpan = (0.0, 0.0)
    mem_pct: NumberSpan = (20.0, 60.0)
    processes: NumberSpan = (1.0, 1.0)
    commands: list[str] = Field(default_factory=lambda: ["python train.py"])
    users: list[str] | None = None
    blip_every: Seconds | None = Field(None, description="idle holders: one busy sample this often")
    ignores_term: bool = False
    sm_ratio: float | None = Field(None, ge=0, le=1, description="SM activity as a share of utilization "
                                   "(GPM); low for a kernel that spins; unset: by kind")
    tensor_ratio: float | None = Field(None, ge=0, le=1, description="tensor activity as a share of "
                                       "utilization; unset: by kind")


class PinnedJob(_Model):
    """A job placed on a GPU at a fixed time, for demos: `start` after the simulation starts."""

    gpu: int = Field(ge=0)
    kind: JobKindName
    node: int | None = Field(None, ge=0, description="node index; unset: every node")
    start: Seconds = 0.0
    age: Seconds = Field(0.0, description="how long it had already run when it starts being seen")
    duration: Seconds | None = None
    user: str | None = None
    command: str | None = None
    util_pct: NumberSpan | None = None
    mem_pct: NumberSpan | None = None
    processes: int = Field(1, ge=1)


_MIG_PROFILE = re.compile(r"^([1-7])g\.(\d+)gb$")
#: GPUs with NVML GPM: Hopper (H100, H200, H20, GH200) and Blackwell (B100, B200, GB200, ...)
_GPM_MODELS = re.compile(r"\bG?[HB]\d{2,3}\b")


class MigLayout(_Model):
    """MIG on some GPUs of each node: the same instances on each, numbered after the physical GPUs."""

    gpus: list[int] = Field(min_length=1, description="indexes of the GPUs with MIG enabled")
    profiles: list[str] = Field(min_length=1, description="their instances, e.g. [3g.40gb, 2g.20gb, 1g.10gb]")

    @field_validator("profiles")
    @classmethod
    def _profiles(cls, v: list[str]) -> list[str]:
        for p in v:
            if not _MIG_PROFILE.match(p):
                raise ValueError(f"{p!r} is not a MIG profile like 1g.10gb or 3g.40gb")
        if sum(slices(p) for p in v) > 7:
            raise ValueError(f"{', '.join(v)} need more than the 7 compute slices of a GPU")
        return v


def slices(profile: str) -> int:
    """Compute slices of a MIG profile: 3 for `3g.40gb`."""
    m = _MIG_PROFILE.match(profile)
    return int(m.group(1)) if m else 1


def profile_mem_mib(profile: str) -> float:
    m = _MIG_PROFILE.match(profile)
    return float(int(m.group(2)) * 1024 - 256) if m else 0.0


class GpuModel(_Model):
    name: str = "NVIDIA H100 80GB HBM3"
    mem_total_mib: float = 81559.0
    mem_reserved_mib: float = 569.0
    power_limit_w: float = 700.0
    idle_power_w: float = 70.0
    idle_temp_c: float = 32.0
    busy_temp_c: float = 72.0
    sm_clock_mhz: NumberSpan = Field((345.0, 1980.0), description="idle, busy")
    mem_clock_mhz: NumberSpan = Field((2619.0, 2619.0), description="idle, busy (HBM does not step down)")
    gpm: bool | None = Field(None, description="NVML GPM activity; unset: from the name (Hopper and later)")
    mig: MigLayout | None = None

    @property
    def has_gpm(self) -> bool:
        return self.gpm if self.gpm is not None else bool(_GPM_MODELS.search(self.name.upper()))


class Scenario(_Model):
    name: str
    description: str = ""
    speedup: float = Field(1.0, gt=0, description="simulated seconds per real second")
    users: list[str] = Field(default_factory=lambda: ["alice", "bob", "carol", "dave"])
    gap: DurationSpan = (60.0, 1800.0)
    busy_at_start: float = Field(0.8, ge=0, le=1)
    gpu: GpuModel = GpuModel()
    kubernetes: bool = Field(False, description="give processes containers and pods")
    slurm: bool = Field(False, description="run each job in a Slurm job (its id in the process's cgroup)")
    namespace: str = "ml"
    jobs: list[JobMix] = Field(default_factory=list)
    pinned: list[PinnedJob] = Field(default_factory=list)

    @model_validator(mode="after")
    def _has_work(self) -> Scenario:
        if not self.jobs and not self.pinned:
            raise ValueError("a scenario needs `jobs` or `pinned`")
        kinds = {j.kind for j in self.jobs}
        for p in self.pinned:
            if p.util_pct is None and p.kind not in kinds and p.kind in ("training", "forgotten"):
                raise ValueError(f"pinned {p.kind} job on gpu {p.gpu} needs util_pct "
                                 f"(no {p.kind} entry in jobs to take it from)")
        return self

    def mix(self, kind: str) -> JobMix | None:
        for j in self.jobs:
            if j.kind == kind:
                return j
        return None


def shipped_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A shipped scenario by name (`mixed`, `demo`, ...) or a YAML file; errors as `file:line: ...`."""
    p = Path(name_or_path)
    if not p.suffix and not p.exists():
        p = SCENARIO_DIR / f"{name_or_path}.yaml"
        if not p.exists():
            raise LocatedError([Located(str(name_or_path), 0,
                                        f"no such scenario; shipped: {', '.join(shipped_scenarios())}")])
    doc = parse_yaml(read_yaml_text(p, "scenario"), str(p))
    if not isinstance(doc.data, dict):
        raise LocatedError([doc.locate((), "a scenario is a mapping (name, jobs, ...)")])
    try:
        return Scenario.model_validate(doc.data)
    except ValidationError as e:
        raise LocatedError(doc.validation_problems(e)) from None
