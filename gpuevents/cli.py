"""The `gpuevents` command line (DESIGN §6)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from gpuevents.config import Config, load_config
from gpuevents.yamlpos import LocatedError

app = typer.Typer(
    name="gpuevents",
    help="Stop wasting GPUs: node agents publish GPU events to NATS; YAML rules act on them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Configuration.", no_args_is_help=True)
app.add_typer(config_app, name="config")

err = Console(stderr=True)
ConfigOption = Annotated[
    Path | None, typer.Option("-c", "--config", help="config YAML (see config.example.yaml)")
]


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


@config_app.command("check")
def config_check(config: Annotated[Path, typer.Option("-c", "--config", help="config YAML")]) -> None:
    """Validate a config file: `file:line: key: problem`, exit 1 on errors."""
    load_config_or_exit(config)
    typer.echo(f"{config}: ok")


# --- sub-commands (one registration line each) ---


def main() -> None:
    app()


if __name__ == "__main__":
    main()
