"""Config `engine.limits` (per action type) and `engine.holds`: the fleet-wide limits of DESIGN §3.4, and what
`max_fleet_pct` does with what it holds."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpuevents.durations import Duration


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LimitConfig(_Section):
    max_per_hour: int | None = Field(None, ge=0)
    max_fleet_pct: float | None = Field(None, ge=0, le=100)
    fleet_floor: int = Field(0, ge=0, description="max_fleet_pct holds only when more than this many match")


class HoldsConfig(_Section):
    """max_fleet_pct's holds asked once per outbreak in `channel`, released there (docs/rules.md); else final."""

    channel: str | None = Field(None, description="the platform's Slack channel, `#gpu-platform`")
    approve_within: Duration = Field(14400, description="how long a held action waits for a release")
