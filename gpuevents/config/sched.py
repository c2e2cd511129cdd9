"""Configuration sections for reading the schedulers: the agent's Slurm job details (`agent.slurm`) and the
demand readers (`demand`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from gpuevents.durations import Duration


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)  # as every section of gpuevents/config/__init__.py


class AgentSlurmConfig(_Section):
    """How the agent learns a Slurm job's details: the prolog's `.jobs/<id>` file, then squeue once per job."""

    details: bool = Field(True, description="ask squeue once per new job for what the prolog's file lacks "
                          "(QOS, time limit, name); false: the prolog's file only")
    squeue: Path = Field(Path("squeue"), description="the squeue binary (a Slurm client configured for the cluster)")
    timeout: Duration = Field(5.0, description="how long one squeue may take (a slow slurmctld)")


class _DemandReaderConfig(_Section):
    enabled: bool = False
    interval: Duration = Field(30.0, ge=5, description="how often the scheduler is asked: at least 5s, every read "
                               "is a query to it")


class DemandSlurmConfig(_DemandReaderConfig):
    """Slurm's pending jobs, read with squeue by the engine holding the lease (never by every agent)."""

    squeue: Path = Path("squeue")
    timeout: Duration = Field(10.0, description="how long one squeue may take")


class DemandKubernetesConfig(_DemandReaderConfig):
    """Pending pods asking for nvidia.com/gpu or a MIG slice, listed through the API (actions.kubernetes's
    connection; RBAC: list pods in all namespaces)."""


class DemandConfig(_Section):
    """GPUs waiting to be allocated, for `demand` in conditions; each reader is off unless configured."""

    slurm: DemandSlurmConfig = DemandSlurmConfig()
    kubernetes: DemandKubernetesConfig = DemandKubernetesConfig()
