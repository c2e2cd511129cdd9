"""`gpuevents status`, `snooze` and `audit`: ask the acting engine or read the bus, print for people."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table
from rich.text import Text

from gpuevents import subjects as S
from gpuevents.cli.common import (
    ClusterOption,
    ConfigOption,
    cells,
    client_config,
    duration_option,
    load_config_or_exit,
    operator_bus,
    run_async,
    site_entity,
)
from gpuevents.clock import SystemClock
from gpuevents.durations import format_duration
from gpuevents.facts import Facts
from gpuevents.records import AuditRecord, decode_audit, unique_records

if TYPE_CHECKING:
    from gpuevents.config import Config
    from gpuevents.wire.fleet import FleetIncident, FleetNode
    from gpuevents.wire.status import StatusSummary

out = Console()


def status(
    node: Annotated[str | None, typer.Option("--node", help="one node in full, with its open incidents")] = None,
    all_: Annotated[bool, typer.Option("--all", help="every node and open incident, fetched a page at a time")] = False,
    top: Annotated[int, typer.Option("--top", min=1, max=20, help="incidents and nodes in the summary")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON (with --all: one JSON object a line)")] = False,
    config: ConfigOption = None,
) -> None:
    """The fleet now, from the acting engines: a summary (GPUs busy, idle and held idle, what the waste costs),
    the costliest firing incidents and the nodes with the most GPUs held idle. `--node` shows one node in full,
    `--all` every node, page by page (each page under the bus's max payload, whatever the fleet's size)."""
    if node is not None and all_:
        typer.echo("error: --node and --all do not go together: ask for one node, or for all of them", err=True)
        raise typer.Exit(2)
    run_async(show_status(client_config(load_config_or_exit(config)), as_json, node=node, all_=all_, top=top))


def snooze(
    rule: Annotated[str, typer.Argument(help="rule name")],
    entity: Annotated[str, typer.Argument(help="entity id, e.g. node-7/gpu0")],
    for_: Annotated[str, typer.Option("--for", help="how long, e.g. 4h")],
    reason: Annotated[str, typer.Option("--reason")] = "",
    cluster: ClusterOption = None,
    config: ConfigOption = None,
) -> None:
    """Exempt one entity from one rule for a while (stored in KV, audited)."""
    seconds = duration_option(for_, "--for")
    cfg = client_config(load_config_or_exit(config))
    run_async(do_snooze(cfg, rule, site_entity(entity, cluster, cfg), seconds, reason))


def keep(
    rule: Annotated[str, typer.Argument(help="rule name")],
    entity: Annotated[str, typer.Argument(help="entity id, e.g. node-7/gpu0")],
    for_: Annotated[str, typer.Argument(help="how long, e.g. 4h (longer than the rule's snooze_max, default 24h, "
                                             "goes to the rule's approving channel)")],
    reason: Annotated[str, typer.Option("--reason", help="why it must stay (required; audited, in the weekly report)")],
    cluster: ClusterOption = None,
    config: ConfigOption = None,
) -> None:
    """What the owner's Keep button does: exempt the entity from the rule for a while, with a reason. Up to the
    rule's snooze_max at once; longer waits for an approval from the rule's `approve:` channel."""
    seconds = duration_option(for_, "FOR")
    cfg = client_config(load_config_or_exit(config))
    run_async(do_snooze(cfg, rule, site_entity(entity, cluster, cfg), seconds, reason, keep=True))


def audit(
    rule: Annotated[str | None, typer.Option("--rule", help="only this rule")] = None,
    entity: Annotated[str | None, typer.Option("--entity", help="only this entity id")] = None,
    since: Annotated[str, typer.Option("--since", help="how far back, e.g. 1h, 7d")] = "1h",
    as_json: Annotated[bool, typer.Option("--json", help="one JSON record a line, the facts included")] = False,
    facts: Annotated[bool, typer.Option("--facts", help="show the facts each decision used")] = False,
    config: ConfigOption = None,
) -> None:
    """What the engine did and why: transitions and action outcomes (and the facts each decision used)."""
    seconds = duration_option(since, "--since")
    run_async(show_audit(client_config(load_config_or_exit(config)), rule, entity, seconds, as_json, facts))


def register(app: typer.Typer) -> None:
    app.command("status")(status)
    app.command("snooze")(snooze)
    app.command("keep")(keep)
    app.command("audit")(audit)


async def show_status(config: Config, as_json: bool, *, node: str | None = None, all_: bool = False,
                      top: int = 10) -> None:
    from gpuevents.bus import BusNoResponders, BusTimeout
    from gpuevents.cli.ask_status import ask_node, ask_pages, ask_summary
    from gpuevents.wire.status import StatusError

    try:
        async with operator_bus(config, "gpuevents-status") as bus:
            if node is not None:
                _show_node(await ask_node(bus, node), node, as_json)
            elif all_:
                shown = False
                for view in ("nodes", "incidents"):
                    async for page in ask_pages(bus, view):
                        shown = True
                        _show_page(page.nodes, page.incidents, as_json)
                if not shown:
                    _no_engine()
            else:
                _show_summary(await ask_summary(bus, top), as_json)
    except (BusNoResponders, BusTimeout):
        _no_engine()
    except StatusError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


def _no_engine() -> None:
    typer.echo("no engine answers on the bus: start `gpuevents engine` or `gpuevents up`", err=True)
    raise typer.Exit(1)


def site_lines(st: StatusSummary) -> list[Text]:
    """One line per site cut off from the hub (DESIGN §9): the site, not its nodes one by one."""
    lines = []
    for v in st.sites:
        if v.linked:
            continue
        heard = "never heard from" if v.last_heard is None else f"last heard {v.last_heard:%Y-%m-%d %H:%M:%S} UTC"
        behind = f", {v.behind} events to catch up" if v.behind else ""
        lines.append(Text(f"SITE {v.cluster} CUT OFF from the hub ({heard}{behind}): its {v.nodes} nodes' readings "
                          "are as of then, and no remedy is decided for them until it is back; its leaf keeps what "
                          "its agents report meanwhile", style="bold red"))
    return lines


def _show_summary(st: StatusSummary | None, as_json: bool) -> None:
    if st is None:
        _no_engine()
        return
    if as_json:
        typer.echo(st.model_dump_json())
        return
    if st.degraded:
        out.print(Text(f"DEGRADED: {st.degraded}", style="bold red"))
    for line in site_lines(st):
        out.print(line)
    f = st.summary
    offline = f" ({f.nodes - f.nodes_online} offline)" if f.nodes_online < f.nodes else ""
    out.print(f"[bold]{f.nodes} nodes{offline}, {f.gpus} GPUs[/]: {f.busy} busy, {f.idle} idle, "
              + (f"{f.unknown} activity unknown, " if f.unknown else "")
              + f"[yellow]{f.held_idle} held idle[/] ({f.held_idle_cost_per_hour_text or '-'}/h); "
              f"incidents: {f.incidents_firing} firing, {f.incidents_pending} pending", soft_wrap=True)
    waiting = [d for d in st.demand if d.partition is None and d.pool is None and d.model is None]
    if st.demand:
        parts = ", ".join(f"{d.partition or d.pool or d.model}: {d.pending_gpus}" for d in st.demand
                          if d not in waiting)
        total = sum(d.pending_gpus for d in waiting)
        oldest = max((d.waiting_for_s or 0.0 for d in st.demand), default=0.0)
        out.print(f"[bold]{total} GPUs waiting[/] to be allocated (oldest {format_duration(oldest)})"
                  + (f": {escape(parts)}" if parts else ""), highlight=False)  # names from the scheduler
    if st.incidents:
        out.print(incident_table(st.incidents, "firing incidents, most costly first"))
        if st.incidents_more:
            out.print(f"… and {st.incidents_more} more firing (`gpuevents status --all` lists every one)")
    else:
        out.print("no firing incidents")
    if st.worst_nodes:
        worst = Table("node", "cluster", "GPUs", "idle", "held idle", "held idle /h",
                      title="nodes with the most GPUs held idle")
        for w in st.worst_nodes:
            worst.add_row(*cells(w.name if w.online else f"{w.name} (offline)", w.cluster, str(w.gpus), str(w.idle),
                                 str(w.held_idle), f"{w.held_idle_cost_per_hour:,.2f} {f.currency}"))
        out.print(worst)
        out.print("`gpuevents status --node NAME` shows one node in full")
    for warning in st.warnings:
        out.print(Text(f"warning: {warning}", style="bold red"))
    if st.exemptions:
        out.print(exemptions_table(st))
        if st.exemptions_more:
            out.print(f"… and {st.exemptions_more} more exemptions")


def exemptions_table(st: StatusSummary) -> Table:
    """Jobs exempt by their annotations until a time, and annotations not applied (malformed)."""
    t = Table("job", "exempt until", "rules", "annotation")
    for e in st.exemptions:
        if e.until is not None:
            until: str | Text = e.until.strftime("%Y-%m-%d %H:%M:%S")
            rules = ", ".join(e.rules) if e.rules else "every rule"
        else:
            until, rules = Text(f"not applied: {e.malformed}", style="red"), ""
        t.add_row(*cells(e.job, until, rules, e.source))
    return t


def _show_node(found: object, name: str, as_json: bool) -> None:
    from gpuevents.wire.status import StatusNode

    if not isinstance(found, StatusNode):
        _no_engine()
        return
    if as_json:
        typer.echo(found.model_dump_json())
    elif not found.nodes:
        typer.echo(f"no node named {name!r} is known to the engine", err=True)
    else:
        _show_page(found.nodes, found.incidents, False)
    if not found.nodes:
        raise typer.Exit(1)


def _show_page(nodes: list[FleetNode], incidents: list[FleetIncident], as_json: bool) -> None:
    if as_json:
        for n in nodes:
            typer.echo(orjson.dumps({"node": n.model_dump(mode="json")}).decode())
        for i in incidents:
            typer.echo(orjson.dumps({"incident": i.model_dump(mode="json")}).decode())
        return
    if nodes:
        out.print(gpu_table(nodes))
    if incidents:
        out.print(incident_table(incidents, "open incidents"))


def gpu_table(nodes: list[FleetNode]) -> Table:
    """Every GPU of these nodes, every machine string shown as written."""
    gpus = Table("node", "gpu", "model", "util %", "mem MiB", "idle for", "owner", "procs")
    for n in nodes:
        for g in n.gpus:
            idle_for = format_duration(g.idle_for_s) if g.idle and g.idle_for_s is not None else ""
            name = n.name if n.online else f"{n.name} (offline)"
            gpus.add_row(*cells(name, str(g.index), g.model or "", _num(g.util_pct),
                                f"{_num(g.mem_used_mib)}/{_num(g.mem_total_mib)}",
                                Text(idle_for, style="yellow") if g.held_idle else idle_for,
                                g.owner or "", str(g.processes)))
    return gpus


def incident_table(incidents: list[FleetIncident], title: str | None = None) -> Table:
    inc = Table("rule", "entity", "status", "since", "owner", "cost", "warning", title=title)
    for i in incidents:
        since = i.firing_since or i.started_at
        inc.add_row(*cells(i.rule, i.entity_id, i.status, since.strftime("%Y-%m-%d %H:%M:%S"),
                           i.owner or "", i.cost or "", i.warning or ""))
    return inc


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


async def do_snooze(config: Config, rule: str, entity: str, seconds: float, reason: str,
                    keep: bool = False) -> None:
    """Ask the acting engine (the one request model Slack's Keep sends too); with none answering, nothing is stored:
    only the engine applies the rule's snooze_max and approvals, so the person is told to ask again."""
    import getpass

    from pydantic import ValidationError

    from gpuevents.bus import BusNoResponders, BusTimeout
    from gpuevents.wire import KeepReply, NoEngine, keep_request

    try:
        req = keep_request(rule, entity, seconds, SystemClock().now(), getpass.getuser(), reason, keep)
    except ValidationError as e:
        typer.echo(f"error: {'; '.join(str(err['msg']).removeprefix('Value error, ') for err in e.errors())}",
                   err=True)
        raise typer.Exit(2) from None
    verb = "kept" if keep else "snoozed"
    async with operator_bus(config, "gpuevents-snooze") as bus:
        try:
            raw = await bus.request(S.ENGINE_SNOOZE, req.model_dump_json().encode(), timeout=5)
        except (BusNoResponders, BusTimeout) as e:
            typer.echo(f"error: {NoEngine(f'{entity} was not {verb}', str(e) or type(e).__name__)}", err=True)
            raise typer.Exit(1) from None
    reply = KeepReply.model_validate_json(raw)
    if reply.ok and reply.over_budget is not None:
        typer.echo(f"{rule}: {entity} not kept yet: {reply.note(seconds)}")
        return
    if not reply.ok or reply.until is None:
        typer.echo(f"error: {reply.error}", err=True)
        raise typer.Exit(1)
    note = reply.note(seconds)
    typer.echo(f"{rule} {verb} for {entity} until {reply.until:%Y-%m-%d %H:%M:%S} UTC" + (f" ({note})" if note else ""))


async def show_audit(config: Config, rule: str | None, entity: str | None, seconds: float,
                     as_json: bool, facts: bool = False) -> None:
    since = SystemClock().now() - timedelta(seconds=seconds)
    subject = S.audit_subject(rule) if rule else S.AUDIT_ALL
    records: list[AuditRecord] = []
    async with operator_bus(config, "gpuevents-audit") as bus:
        async for m in bus.replay(S.STREAM_AUDIT, subject, since=since):
            records += [r for r in decode_audit(m.data) if not entity or r.entity_id == entity]
    records = unique_records(records)  # a transition sent again after a crash is one transition
    records.sort(key=lambda r: r.time)  # a batch's records are grouped by rule in the stream
    if as_json:
        for r in records:
            typer.echo(r.model_dump_json())
        return
    out.print(audit_table(records, facts) if records else f"no audit records in the last {format_duration(seconds)}")


def facts_text(facts: Facts) -> str:
    """The facts a decision used, one `path=value` a line (nested keys joined by dots)."""
    lines: list[str] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            lines.append(f"{prefix}={json.dumps(value, default=str)}")

    walk("", facts.model_dump(mode="json"))
    return "\n".join(lines)


def audit_table(records: list[AuditRecord], facts: bool = False) -> Table:
    """One row per record, every machine string shown as written and whole: a cell too wide for the terminal
    (or for the 80 columns of a pipe) wraps, never cuts."""
    table = Table(*(Column(h, overflow="fold") for h in ("time", "rule", "entity", "what", "outcome", "detail")),
                  *((Column("facts", overflow="fold"),) if facts else ()))
    for r in records:
        if r.kind == "transition":
            what, outcome = "transition", f"{r.from_status} → {r.to_status}"
        elif r.kind == "action":
            what, outcome = r.action_type or "action", (r.outcome or "") + (" (dry run)" if r.dry_run else "")
        else:
            what, outcome = r.kind, ""
        detail = r.error or r.detail or ""
        row = [r.time.strftime("%m-%d %H:%M:%S"), r.rule, r.entity_id, what, outcome, detail]
        table.add_row(*cells(*row, *((facts_text(r.facts),) if facts else ())))
    return table
