"""What every verb shares: logging, loading the config, options, durations, running a coroutine."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.text import Text

from gpuevents.bus import CLIENT_CONNECT_S, Bus, BusError, BusUnreachable
from gpuevents.cli.parts import PartFailed
from gpuevents.config import Config, load_config
from gpuevents.durations import DurationError, parse_duration
from gpuevents.server import ServerError
from gpuevents.yamlpos import LocatedError

T = TypeVar("T")

ConfigOption = Annotated[
    Path | None, typer.Option("-c", "--config", help="config YAML (see config.example.yaml)")
]
VerboseOption = Annotated[bool, typer.Option("-v", "--verbose")]


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    logging.getLogger("nats").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def load_config_or_exit(path: Path | None) -> Config:
    """The config, or the problems as `file:line: key: problem` and exit 1."""
    try:
        return load_config(path)
    except LocatedError as e:
        for p in e.problems:
            typer.echo(str(p), err=True)
        raise typer.Exit(1) from None


def client_config(config: Config) -> Config:
    """For commands that talk to a running gpuevents: with no nats.url, the embedded server's address."""
    if config.nats.servers:
        return config
    e = config.nats.embedded
    url = f"nats://{e.host}:{e.port or 4222}"
    return config.model_copy(update={"nats": config.nats.model_copy(update={"url": url})})


def operator_bus(config: Config, name: str) -> Bus:
    """The connection of a command a person runs: the operator's inbox (DESIGN §7.1), and BusUnreachable, with
    the address, when NATS does not answer within CLIENT_CONNECT_S."""
    return Bus(config.nats, name=name, role="operator", give_up_after=CLIENT_CONNECT_S)


def duration_option(text: str, option: str) -> float:
    """Seconds in a duration option, or a clear error and exit 2."""
    try:
        return parse_duration(text)
    except DurationError as e:
        typer.echo(f"error: {option} {e}", err=True)
        raise typer.Exit(2) from None


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro`; Ctrl-C exits 130, NATS out of reach prints one line and exits 2, another NATS or embedded-server
    failure prints one line and exits 1."""
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except BusUnreachable as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except (ServerError, BusError, PartFailed) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


def cells(*values: str | Text) -> list[Text]:
    """Table cells shown as written: strings from the machine (a process named `x[/oops]`, an audit detail
    `[bold red]EVIL[/]`) are never read as Rich markup."""
    return [v if isinstance(v, Text) else Text(v) for v in values]
