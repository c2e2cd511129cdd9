"""What every verb shares: logging, loading the config, options, durations, running a coroutine."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.text import Text

from gpuevents.durations import DurationError, parse_duration

if TYPE_CHECKING:  # the runtime imports are in the functions, so a verb's --help does not load the bus (item 7)
    from gpuevents.bus import Bus
    from gpuevents.config import Config

T = TypeVar("T")

ConfigOption = Annotated[
    Path | None, typer.Option("-c", "--config", help="config YAML (see config.example.yaml)")
]
VerboseOption = Annotated[bool, typer.Option("-v", "--verbose")]
ClusterOption = Annotated[str | None, typer.Option("--cluster", help="the cluster the target is in; default: the "
                                                   "config's `cluster`")]


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
    from gpuevents.config import load_config
    from gpuevents.yamlpos import LocatedError

    try:
        return load_config(path)
    except LocatedError as e:
        for p in e.problems:
            typer.echo(str(p), err=True)
        raise typer.Exit(1) from None


class NoUsageError(LookupError):
    """There is no usage store to report from."""


def usage_db(config: Config, what: str = "it") -> Path:
    """The usage store's path (config `engine.usage_db`); NoUsageError, saying where, when nothing was recorded."""
    path = config.engine.usage_db
    if not path.exists():
        raise NoUsageError(f"{path}: no usage recorded yet; the engine records {what} there (config engine.usage_db)")
    return path


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
    from gpuevents.bus import CLIENT_CONNECT_S, Bus

    return Bus(config.nats, name=name, role="operator", give_up_after=CLIENT_CONNECT_S)


def duration_option(text: str, option: str) -> float:
    """Seconds in a duration option, or a clear error and exit 2."""
    try:
        return parse_duration(text)
    except DurationError as e:
        typer.echo(f"error: {option} {e}", err=True)
        raise typer.Exit(2) from None


def parse_day(text: str, flag: str) -> datetime:
    """A date (`2026-09-01`, midnight UTC) or a time with its offset, as UTC; a clear error naming `flag`."""
    try:
        return datetime.fromisoformat(text).replace(tzinfo=UTC) if len(text) <= 10 else (
            datetime.fromisoformat(text).astimezone(UTC))
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a date like 2026-09-01", param_hint=flag) from None


class PartFailed(RuntimeError):
    """A part of a long-running command (gpuevents/cli/parts.py) ended on its own (it failed, or returned while
    it should have run on): the process stops and exits non-zero, so a supervisor that restarts on failure
    starts it again."""


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro`; Ctrl-C exits 130, NATS out of reach prints one line and exits 2, another NATS or embedded-server
    failure, or a configured port in use, prints one line and exits 1."""
    from gpuevents.bus import BusError, BusUnreachable
    from gpuevents.ports import PortInUse
    from gpuevents.server import ServerError

    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except BusUnreachable as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except (ServerError, BusError, PartFailed, PortInUse) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


def cells(*values: str | Text) -> list[Text]:
    """Table cells shown as written: strings from the machine (a process named `x[/oops]`, an audit detail
    `[bold red]EVIL[/]`) are never read as Rich markup."""
    return [v if isinstance(v, Text) else Text(v) for v in values]


def site_entity(entity: str, cluster: str | None, config: Config) -> str:
    """An entity id as the engine keys it: one of another cluster than the config's (`--cluster`) is
    `<cluster>:<id>`; an id that names its cluster already is left as it is."""
    if cluster is None or cluster == config.cluster or entity.startswith(f"{cluster}:"):
        return entity
    return f"{cluster}:{entity}"
