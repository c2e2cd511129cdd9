"""`gpuevents free`: the GPUs to start a job on now, most idle first, with each node's CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from gpuevents import subjects as S
from gpuevents.cli.common import ConfigOption, cells, client_config, load_config_or_exit, operator_bus, run_async
from gpuevents.config import Config
from gpuevents.durations import format_duration

if TYPE_CHECKING:
    from gpuevents.wire.free import FreeAnswer, FreeQuery

out = Console()

REASON_TEXT = {
    "offline": "on offline nodes", "cordoned": "on cordoned nodes", "lost": "lost", "allocated":
    "allocated by a scheduler", "held": "held by a process", "busy": "in use", "filtered": "not matching",
}


def free(
    count: Annotated[int | None, typer.Option("--count", "-n", min=1, max=1024,
                                              help="GPUs the job needs on one node")] = None,
    min_free_mem: Annotated[str | None, typer.Option("--min-free-mem",
                                                     help="free memory per GPU, e.g. 40G or 40000M")] = None,
    model: Annotated[str | None, typer.Option("--model", help="part of the model name, e.g. H100")] = None,
    label: Annotated[list[str] | None, typer.Option("--label", "-l",
                                                    help="node label KEY=VALUE (or KEY); repeatable")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help="only this cluster")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="at most this many nodes")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the answer as JSON")] = False,
    config: ConfigOption = None,
) -> None:
    """The GPUs to start a job on now, most idle first, with the CUDA_VISIBLE_DEVICES line for each node.

    Never offers a GPU that a process holds, that a scheduler allocated, or that is on an offline or cordoned
    node. Exit 0 when something is free, 1 when nothing matches."""
    from gpuevents.wire.free import FreeQuery, FreeQueryError, parse_labels, parse_mem_mib

    try:
        query = FreeQuery(count=count, min_free_mem_mib=parse_mem_mib(min_free_mem) if min_free_mem else None,
                          model=model, labels=parse_labels(label or []), cluster=cluster, limit=limit)
    except FreeQueryError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    answer = run_async(ask_free(client_config(load_config_or_exit(config)), query))
    if answer is None:
        typer.echo("no engine answers on the bus: start `gpuevents engine` or `gpuevents up`", err=True)
        raise typer.Exit(1)
    if as_json:
        typer.echo(answer.model_dump_json(indent=2))
    else:
        show_free(answer)
    if not answer.nodes:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("free")(free)


async def ask_free(config: Config, query: FreeQuery) -> FreeAnswer | None:
    """Every acting engine answers for its part of the fleet (with the same function as the dashboard's /api/free),
    so the reply stays small however large the fleet; the answers are merged."""
    from pydantic import ValidationError

    from gpuevents.wire import ErrorReply, FreeReply
    from gpuevents.wire.free import merge_answers

    def parsed(raw: bytes) -> FreeReply | ErrorReply:
        try:
            return FreeReply.model_validate_json(raw)
        except ValidationError:
            return ErrorReply.model_validate_json(raw)

    def complete(replies: list[bytes]) -> bool:
        parts = [p for p in map(parsed, replies) if isinstance(p, FreeReply)]
        return bool(parts) and len({p.partition for p in parts}) >= parts[0].partitions

    async with operator_bus(config, "gpuevents-free") as bus:
        replies = await bus.request_many(S.ENGINE_FREE, query.model_dump_json().encode(), 5.0, enough=complete)
    seen: dict[Any, FreeAnswer] = {}
    errors = []
    for reply in map(parsed, replies):
        if isinstance(reply, ErrorReply):
            errors.append(reply.error)
        else:
            seen.setdefault(reply.partition, reply.answer)
    if errors and not seen:
        typer.echo(f"error: {errors[0]}", err=True)
        raise typer.Exit(1)
    return merge_answers(list(seen.values()), query) if seen else None


def _gib(mib: float | None) -> str:
    return "-" if mib is None else f"{mib / 1024:,.1f} GiB"


def show_free(answer: FreeAnswer) -> None:
    not_offered = ", ".join(f"{n} {REASON_TEXT.get(k, k)}" for k, n in answer.excluded.items())
    gpus = sum(len(n.gpus) for n in answer.nodes)
    if not answer.nodes:
        need = f" {answer.query.count} on one node" if answer.query.count else ""
        out.print(f"No GPU is free{need} that matches." + (f" Not offered: {not_offered}." if not_offered else ""),
                  soft_wrap=True)
        return
    out.print(f"[bold]{gpus} GPU(s) on {len(answer.nodes)} node(s)[/], most idle first"
              + (f" · not offered: {not_offered}" if not_offered else ""), soft_wrap=True)
    table = Table("node", "gpu", "model", "idle for", "util %", "free memory")
    for node in answer.nodes:
        for g in node.gpus:
            table.add_row(*cells(node.node, str(g.index), g.model or "",
                                 format_duration(g.idle_for_s) if g.idle_for_s is not None else "",
                                 "-" if g.util_pct is None else f"{g.util_pct:.0f}", _gib(g.mem_free_mib)))
    out.print(table)
    if answer.more_nodes:
        out.print(f"… and {answer.more_nodes} more node(s) with free GPUs, left out to keep the answer within what the "
                  "bus carries: narrow it with --count, --model, --label or --limit", soft_wrap=True)
    for node in answer.nodes:
        # printed plainly (no markup, no wrapping, no control characters), so it can be copied as it is
        out.print(f"{_printable(node.node)}: {node.env}", markup=False, highlight=False, soft_wrap=True)


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)
