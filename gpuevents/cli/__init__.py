"""The `gpuevents` command line (DESIGN §6) and composition root: one module per verb group, listed in cli/lazy.py
and imported only when its verb runs, so `gpuevents --help` answers at once."""

from __future__ import annotations

import typer

from gpuevents.cli.lazy import LazyGroup

# The verbs (up, engine, runner; status, snooze, keep, audit; agent, simulate; free; kill, cancel; rules check |
# test | backtest; config check; report; rightsize; job; jobs; import) are in gpuevents.cli.lazy.VERBS.
app = typer.Typer(
    name="gpuevents",
    cls=LazyGroup,
    help="Stop wasting GPUs: node agents publish GPU events to NATS; YAML rules act on them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _group() -> None:
    # A callback makes Typer build the group (LazyGroup) although no command is registered on `app` itself.
    pass


def main() -> None:
    app()


if __name__ == "__main__":
    main()
