"""`gpuevents pause|resume|cordon|uncordon TARGET`: a person's remedy or its undo, asked of the acting engine like
`gpuevents kill` (DESIGN §6): dry run, protection, limits and the audit apply; an undo is never limited, and the
runner works from what the remedy wrote on the object (`gpuevents.io/*` annotations), so it needs no record in
the engine's store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from gpuevents.cli.common import ClusterOption, ConfigOption, client_config, load_config_or_exit, run_async
from gpuevents.cli.manual import ask

ReasonOption = Annotated[str, typer.Option("--reason", help="why (audited; said in the workload's Event)")]
ProviderOption = Annotated[Literal["kubernetes", "slurm"], typer.Option(
    "--provider", help="kubernetes (spec.unschedulable) or slurm (scontrol DRAIN/RESUME)")]
WorkloadArgument = Annotated[str, typer.Argument(help="the workload: namespace/Kind/name, e.g. ml/Deployment/trainer")]
NodeArgument = Annotated[str, typer.Argument(help="the node's name")]


def _ask(config: Path | None, cluster: str | None, fields: dict[str, object]) -> None:
    cfg = client_config(load_config_or_exit(config))
    run_async(ask(cfg, {"cluster": cluster or cfg.cluster, **fields}))


def pause(job: WorkloadArgument, reason: ReasonOption = "", cluster: ClusterOption = None,
          config: ConfigOption = None) -> None:
    """Pause a Kubernetes workload the way its kind is stopped, through the engine: protection, limits and dry run
    apply; the audit records it."""
    _ask(config, cluster, {"type": "pause", "job": job, "reason": reason})


def resume(job: WorkloadArgument, reason: ReasonOption = "", cluster: ClusterOption = None,
           config: ConfigOption = None) -> None:
    """Set back exactly what a pause changed, from the workload's annotations, through the engine; never limited."""
    _ask(config, cluster, {"type": "resume", "job": job, "reason": reason})


def cordon(node: NodeArgument, reason: ReasonOption = "", provider: ProviderOption = "kubernetes",
           cluster: ClusterOption = None, config: ConfigOption = None) -> None:
    """Mark a node unschedulable, through the engine: protection, limits and dry run apply; the audit records it."""
    _ask(config, cluster, {"type": "cordon", "node": node, "reason": reason, "provider": provider})


def uncordon(node: NodeArgument, reason: ReasonOption = "", provider: ProviderOption = "kubernetes",
             cluster: ClusterOption = None, config: ConfigOption = None) -> None:
    """Mark a node schedulable again, if gpuevents cordoned it, through the engine; never limited."""
    _ask(config, cluster, {"type": "uncordon", "node": node, "reason": reason, "provider": provider})


def register(app: typer.Typer) -> None:
    for command in (pause, resume, cordon, uncordon):
        app.command(command.__name__)(command)
