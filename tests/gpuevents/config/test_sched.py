"""The scheduler-reading sections: durations as users write them, a demand reader asked at most every 5 s, off
unless configured, unknown keys refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuevents.config.sched import AgentSlurmConfig, DemandConfig


def test_demand_readers_are_off_unless_configured_and_take_durations() -> None:
    assert not DemandConfig().slurm.enabled and not DemandConfig().kubernetes.enabled
    cfg = DemandConfig.model_validate({"slurm": {"enabled": True, "interval": "1m", "squeue": "/opt/slurm/squeue"}})
    assert (cfg.slurm.enabled, cfg.slurm.interval, cfg.slurm.squeue) == (True, 60.0, Path("/opt/slurm/squeue"))


def test_a_demand_reader_asked_more_often_than_every_5s_is_refused() -> None:
    with pytest.raises(ValidationError, match="greater than or equal to 5"):
        DemandConfig.model_validate({"kubernetes": {"enabled": True, "interval": "2s"}})


def test_the_agents_slurm_section_and_an_unknown_key() -> None:
    assert AgentSlurmConfig.model_validate({"timeout": "500ms"}).timeout == 0.5
    with pytest.raises(ValidationError, match="sqeue"):
        AgentSlurmConfig.model_validate({"sqeue": "/usr/bin/squeue"})
