"""Configuration sections for what the agent reads from and does to its GPUs beyond NVML's readings: a
dcgm-exporter on the node for MIG instances' activity (`agent.dcgm`), and lowered power limits
(`agent.power_cap`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuevents.durations import Duration


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)  # as every section of gpuevents/config/__init__.py


class AgentDcgmConfig(_Section):
    """A dcgm-exporter on the node: its per-instance profiling (`DCGM_FI_PROF_GR_ENGINE_ACTIVE` by `GPU_I_ID`)
    decides whether a MIG instance of a GPU without GPM (A100, A30) is idle."""

    url: str | None = Field(None, description="its /metrics, e.g. http://127.0.0.1:9400/metrics; unset: not read")
    interval: Duration = Field(15.0, gt=0, description="how often it is read (it collects every 30s by default)")
    timeout: Duration = Field(2.0, gt=0, description="how long one read may take")
    max_age: Duration = Field(90.0, gt=0, description="a value older than this is no signal")

    @field_validator("url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL, like http://127.0.0.1:9400/metrics")
        return v


class AgentPowerCapConfig(_Section):
    """The `power_cap` command: how often this node's agent may lower a limit, and whether it only says so."""

    max_per_minute: int = Field(10, ge=0, description="caps in any rolling minute; 0 refuses every cap")
    dry_run: bool = Field(False, description="answer what would be done, set no limit")
