"""`gpuevents config check`: validate a config file, unknown action types in `engine.limits` included."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuevents.cli.common import load_config_or_exit
from gpuevents.config import Config
from gpuevents.yamlpos import Located, YamlDoc, parse_yaml, read_yaml_text

app = typer.Typer(help="Configuration.", no_args_is_help=True)


@app.command("check")
def config_check(config: Annotated[Path, typer.Option("-c", "--config", help="config YAML")]) -> None:
    """Validate a config file: `file:line: key: problem`, exit 1 on errors."""
    cfg = load_config_or_exit(config)
    problems = unknown_limit_types(cfg, config)
    for p in problems:
        typer.echo(str(p), err=True)
    if problems:
        raise typer.Exit(1)
    typer.echo(f"{config}: ok")


def unknown_limit_types(cfg: Config, path: Path | None) -> list[Located]:
    """`engine.limits` keys that name no action type: a typo there silently removes a safety limit."""
    from actions import registry

    known = set(registry.types())
    unknown = [k for k in cfg.engine.limits if k not in known]
    if not unknown:
        return []
    doc = parse_yaml(read_yaml_text(path, "config"), str(path)) if path is not None else YamlDoc(file="<env>", data={})
    return [doc.locate(("engine", "limits", k), f"engine.limits.{k}: unknown action type; known: "
                       f"{', '.join(sorted(known))}") for k in unknown]
