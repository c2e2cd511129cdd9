"""`gpuevents kill` and `gpuevents cancel`: a person's action, asked of the acting engine, which decides it like a
rule's (protection, engine.limits, engine.dry_run) and audits it; the command line never commands an agent."""

from __future__ import annotations

import getpass
from typing import Annotated

import typer
from pydantic import ValidationError

from gpuevents import subjects as S
from gpuevents.bus import BusNoResponders, BusTimeout
from gpuevents.cli.common import (
    ClusterOption,
    ConfigOption,
    client_config,
    duration_option,
    load_config_or_exit,
    operator_bus,
    run_async,
)
from gpuevents.commands import Signal
from gpuevents.config import Config
from gpuevents.wire.manual import OperatorAction, OperatorActionReply

ASK_TIMEOUT_S = 10.0

SAID = {"run": "handed to the action runners", "dry_run": "dry run: nothing was done",
        "refused": "refused", "suppressed": "suppressed by engine.limits", "held": "held"}


def kill(
    node: Annotated[str, typer.Argument(help="the node the process runs on")],
    pid: Annotated[int, typer.Argument(help="the process id on that node", min=1)],
    signal: Annotated[Signal, typer.Option("--signal", help="the first signal; SIGKILL after --grace")] = "TERM",
    grace: Annotated[str, typer.Option("--grace", help="how long before SIGKILL, e.g. 30s")] = "30s",
    reason: Annotated[str, typer.Option("--reason", help="why (audited, and told to the agent)")] = "",
    cluster: ClusterOption = None,
    config: ConfigOption = None,
) -> None:
    """End one process, through the engine: protection, limits and dry run apply; the audit records it."""
    seconds = duration_option(grace, "--grace")
    cfg = client_config(load_config_or_exit(config))
    run_async(ask(cfg, {"type": "kill", "node": node, "pid": pid, "signal": signal, "grace": seconds,
                        "reason": reason, "cluster": cluster or cfg.cluster}))


def cancel(
    job: Annotated[str, typer.Argument(help="the job id (Slurm) or namespace/pod (Kubernetes)")],
    reason: Annotated[str, typer.Option("--reason", help="why (audited)")] = "",
    cluster: ClusterOption = None,
    config: ConfigOption = None,
) -> None:
    """Cancel one job, through the engine: protection, limits and dry run apply; the audit records it."""
    cfg = client_config(load_config_or_exit(config))
    run_async(ask(cfg, {"type": "cancel", "job": job, "reason": reason, "cluster": cluster or cfg.cluster}))


def register(app: typer.Typer) -> None:
    app.command("kill")(kill)
    app.command("cancel")(cancel)


async def ask(config: Config, fields: dict[str, object]) -> None:
    try:
        # the site the person named (--cluster), else the config's own
        req = OperatorAction.model_validate({"cluster": config.cluster, **fields, "by": getpass.getuser()})
    except ValidationError as e:
        said = "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in e.errors())
        typer.echo(f"error: {said}", err=True)
        raise typer.Exit(2) from None
    async with operator_bus(config, "gpuevents-" + req.type) as bus:
        try:
            raw = await bus.request(S.ENGINE_ACT, req.model_dump_json().encode(), timeout=ASK_TIMEOUT_S)
        except (BusNoResponders, BusTimeout):
            typer.echo("error: no engine answered (none runs, or none knows this target): start "
                       "`gpuevents engine`, and see `gpuevents status`", err=True)
            raise typer.Exit(1) from None
    reply = OperatorActionReply.model_validate_json(raw)
    if not reply.ok:
        typer.echo(f"error: {reply.error}", err=True)
        raise typer.Exit(1)
    said = SAID.get(reply.decision or "", reply.decision or "?")
    why = f" ({reply.reason})" if reply.reason and reply.decision != "dry_run" else ""
    typer.echo(f"{req.type} of {reply.entity_id}: {said}{why}; see `gpuevents audit --entity {reply.entity_id}` "
               f"(key {reply.key})")
    if reply.decision in ("refused", "suppressed", "held"):
        raise typer.Exit(1)
