"""The `gpuevents` command line (DESIGN §6) and composition root: one module per verb group, registered here."""

from __future__ import annotations

import typer

from gpuevents.cli import agent, client, configcheck, free, manual, rules, serve
from gpuevents.cli.jobs import job_command, jobs_command
from gpuevents.cli.report import report_command
from gpuevents.cli.rightsize import rightsize_command

app = typer.Typer(
    name="gpuevents",
    help="Stop wasting GPUs: node agents publish GPU events to NATS; YAML rules act on them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
serve.register(app)  # up, engine, runner
client.register(app)  # status, snooze, audit
agent.register(app)  # agent, simulate
free.register(app)  # free
manual.register(app)  # kill, cancel (asked of the engine)
app.add_typer(rules.app, name="rules")  # rules check | test | backtest
app.add_typer(configcheck.app, name="config")  # config check
app.command("report")(report_command)  # report
app.command("rightsize")(rightsize_command)  # rightsize
app.command("job")(job_command)  # job ID
app.command("jobs")(jobs_command)  # jobs [--user U] [--since 7d]


def main() -> None:
    app()


if __name__ == "__main__":
    main()
