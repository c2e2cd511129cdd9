"""The verb table and a command group that imports a verb's module only when that verb runs or shows its help."""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

import typer
import typer.main
from typer import _click
from typer.core import TyperCommand, TyperGroup


class Verb(NamedTuple):
    """Where a verb lives: its module, how the module gives it (`register(app)`, a Typer `app` of subcommands,
    or the name of a command function), and the line `gpuevents --help` shows for it without importing it."""

    module: str
    given_by: str
    summary: str


# In the order `gpuevents --help` lists them. `summary` is the first paragraph of the command's docstring
# (tests/gpuevents/cli/test_lazy.py checks that every one matches).
VERBS: dict[str, Verb] = {
    "up": Verb("gpuevents.cli.serve", "register",
               "Everything on one machine: embedded NATS (unless nats.url is set), the engine, action runners and "
               "a local agent."),
    "engine": Verb("gpuevents.cli.serve", "register",
                   "The rules engine and its action runners (engine.runners of them)."),
    "runner": Verb("gpuevents.cli.serve", "register",
                   "Action runners apart from the engine: they share GPUEVENTS_ACT as a queue."),
    "status": Verb("gpuevents.cli.client", "register",
                   "The fleet now, from the acting engines: a summary (GPUs busy, idle and held idle, what the "
                   "waste costs), the costliest firing incidents and the nodes with the most GPUs held idle. "
                   "`--node` shows one node in full, `--all` every node, page by page (each page under the bus's "
                   "max payload, whatever the fleet's size)."),
    "snooze": Verb("gpuevents.cli.client", "register",
                   "Exempt one entity from one rule for a while (stored in KV, audited)."),
    "keep": Verb("gpuevents.cli.client", "register",
                 "What the owner's Keep button does: exempt the entity from the rule for a while, with a reason. "
                 "Up to the rule's snooze_max at once; longer waits for an approval from the rule's `approve:` "
                 "channel."),
    "audit": Verb("gpuevents.cli.client", "register",
                  "What the engine did and why: transitions and action outcomes (and the facts each decision "
                  "used)."),
    "agent": Verb("gpuevents.cli.agent", "register",
                  "The node agent: samples GPUs through NVML, publishes events, answers kill commands."),
    "simulate": Verb("gpuevents.cli.agent", "register",
                     "Simulated agents publishing to the bus, for demos and load tests; or, with --history, a "
                     "simulated past of usage for reports and the dashboard's heatmap."),
    "free": Verb("gpuevents.cli.free", "register",
                 "The GPUs to start a job on now, most idle first, with the CUDA_VISIBLE_DEVICES line for each node."),
    "kill": Verb("gpuevents.cli.manual", "register",
                 "End one process, through the engine: protection, limits and dry run apply; the audit records it."),
    "cancel": Verb("gpuevents.cli.manual", "register",
                   "Cancel one job, through the engine: protection, limits and dry run apply; the audit records it."),
    "pause": Verb("gpuevents.cli.remedies", "register",
                  "Pause a Kubernetes workload the way its kind is stopped, through the engine: protection, limits "
                  "and dry run apply; the audit records it."),
    "resume": Verb("gpuevents.cli.remedies", "register",
                   "Set back exactly what a pause changed, from the workload's annotations, through the engine; never "
                   "limited."),
    "cordon": Verb("gpuevents.cli.remedies", "register",
                   "Mark a node unschedulable, through the engine: protection, limits and dry run apply; the audit "
                   "records it."),
    "uncordon": Verb("gpuevents.cli.remedies", "register",
                     "Mark a node schedulable again, if gpuevents cordoned it, through the engine; never limited."),
    "rules": Verb("gpuevents.cli.rules", "app", "Validate and test rule files."),
    "config": Verb("gpuevents.cli.configcheck", "app", "Configuration."),
    "report": Verb("gpuevents.cli.report", "report_command",
                   "Weekly GPU usage: per team and owner, hours used and held idle, waste in money, week over week, "
                   "the owners' leaderboard, top idle jobs, a heatmap."),
    "rightsize": Verb("gpuevents.cli.rightsize", "rightsize_command",
                      "Which jobs and workloads would run on a MIG slice, a smaller GPU or a shared GPU, and what "
                      "that saves."),
    "job": Verb("gpuevents.cli.jobs", "job_command",
                "A job's summary: GPU-hours, mean, p95 and peak utilisation and SM activity, p95 and peak memory, "
                "idle share, cost, the MIG slice it would have fitted."),
    "jobs": Verb("gpuevents.cli.jobs", "jobs_command", "The jobs of a window, most recent first, one a line."),
    "import": Verb("gpuevents.cli.importing", "import_command",
                   "Bring the site's past into the usage store: dcgm-exporter's series from Prometheus, or jobs from "
                   "Slurm's accounting; imported hours are marked imported, and hours the engine recorded live "
                   "win."),
}


def load_verb(name: str) -> _click.Command:
    """The real command of verb `name`, built by Typer from its module (imported now)."""
    verb = VERBS[name]
    module = importlib.import_module(verb.module)
    if verb.given_by == "app":
        group = typer.main.get_group(module.app)
        group.name = name
        return group
    holder = typer.Typer()
    if verb.given_by == "register":
        module.register(holder)
    else:
        holder.command(name)(getattr(module, verb.given_by))
    return typer.main.get_group(holder).commands[name]


class LazyGroup(TyperGroup):
    """The top-level `gpuevents` group: lists every verb from VERBS, imports a verb's module only to run it or
    show its own help, so `gpuevents --help` imports typer and nothing of gpuevents' runtime."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self._listing = False
        self._loaded: dict[str, _click.Command] = {}

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return [*VERBS, *(n for n in self.commands if n not in VERBS)]

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        if cmd_name not in VERBS:
            return super().get_command(ctx, cmd_name)
        if self._listing:
            return TyperCommand(cmd_name, help=VERBS[cmd_name].summary)
        if cmd_name not in self._loaded:
            self._loaded[cmd_name] = load_verb(cmd_name)
        return self._loaded[cmd_name]

    def format_help(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False
