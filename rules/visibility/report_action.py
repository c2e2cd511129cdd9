"""The `report` action: posts each team's weekly usage summary to its Slack channel (for a schedule rule)."""

from __future__ import annotations

import asyncio
import builtins
import logging
import sys
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator
from slack_sdk.web.async_client import AsyncWebClient

from actions import slack_format as fmt
from actions.builtin.slack import SlackAction
from actions.protocol import ALL_KINDS, ActionContext, ActionParams, ActionResult, ActionUnit, PermanentError
from actions.registry import register
from actions.services import services_of
from gpuevents.cli.report import NoUsageError, make_report
from gpuevents.costs import CostModel
from rules.visibility.weekly import WeeklyReport, team_label

log = logging.getLogger(__name__)


class ReportParams(ActionParams):
    type: Literal["report"] = "report"
    channels: dict[str, str] = Field(
        default_factory=dict, description="team → where its summary goes: #channel, channel id, email or @handle")
    to: str | None = Field(None, description="where the whole fleet's summary goes, if anywhere")
    top_jobs: int = Field(3, ge=0, le=20, description="idle jobs listed per team")

    @model_validator(mode="after")
    def _somewhere(self) -> ReportParams:
        if not self.channels and not self.to:
            raise ValueError("give `channels` (team → #channel) or `to`")
        return self


def summary_text(report: WeeklyReport, costs: CostModel, top_jobs: int) -> str:
    """The weekly summary as Slack mrkdwn; names from machines are escaped."""
    e = fmt.escape
    f = costs.format
    fl = report.fleet
    who = "the fleet" if report.team is None else f"team *{e(team_label(report.team))}*"
    util = "–" if fl.util_pct is None else f"{fl.util_pct:.0f}%"
    lines = [
        f"*Weekly GPU usage for {who}* ({report.since:%b %d} – {report.until:%b %d})",
        f"{fl.busy_h:,.1f} GPU-hours busy · utilization {util} · total cost {f(fl.cost)}",
        f":warning: Held idle: {fl.held_idle_h:,.1f} GPU-hours = *{f(fl.held_idle_cost)}* · "
        f"unallocated: {fl.unallocated_h:,.1f} GPU-hours = {f(fl.unallocated_cost)}",
    ]
    owners = sorted((o for t in report.teams for o in t.owners if o.held_idle_h > 0),
                    key=lambda o: -o.held_idle_cost)[:5]
    if owners:
        lines.append("Held idle by: " + ", ".join(
            f"{e(o.owner)} {o.held_idle_h:,.1f} h ({f(o.held_idle_cost)})" for o in owners))
    for j in report.top_idle_jobs[:top_jobs]:
        lines.append(f"• {e(j.name)} on {e(j.node)} GPU {','.join(map(str, j.gpus))} ({e(j.owner)}): "
                     f"{j.held_idle_h:,.1f} h idle, {f(j.cost)}")
    return fmt.truncate("\n".join(lines))


@register
class ReportAction:
    type: ClassVar[str] = "report"
    params: ClassVar[builtins.type[ActionParams]] = ReportParams
    entity_kinds = ALL_KINDS
    destructive: ClassVar[bool] = False
    unit: ClassVar[ActionUnit] = "entity"
    escape = staticmethod(fmt.escape)

    async def run(self, ctx: ActionContext) -> ActionResult:
        p = ctx.params
        assert isinstance(p, ReportParams)
        svc = services_of(ctx)
        now = svc.clock.now()
        targets: list[tuple[str | None, str]] = [(team, to) for team, to in sorted(p.channels.items())]
        if p.to:
            targets.append((None, p.to))
        messages: list[tuple[str, str]] = []
        for team, to in targets:
            try:
                report, costs = await asyncio.to_thread(make_report, ctx.config, now, team)
            except NoUsageError as e:
                raise PermanentError(str(e)) from None
            if team is not None and not report.teams:
                continue  # nothing recorded for that team this week: no message
            messages.append((to, summary_text(report, costs, p.top_jobs)))
        token = ctx.config.actions.slack.token()
        if token is None:
            for to, text in messages:
                sys.stdout.write(f"[slack → {to}] {text}\n")
            sys.stdout.flush()
            return ActionResult(detail=f"{len(messages)} summaries printed (no SLACK_BOT_TOKEN)")
        base = ctx.config.actions.slack.base_url or AsyncWebClient.BASE_URL
        client = AsyncWebClient(token=token, base_url=base if base.endswith("/") else base + "/",
                                timeout=int(ctx.config.actions.timeout), retry_handlers=[])
        slack = svc.cache.setdefault("report.slack", SlackAction())
        sent: list[dict[str, Any]] = []
        for to, text in messages:
            blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
            result = await slack.post(client, to, text, blocks, svc.clock.monotonic())
            sent.append({"to": to, **result.data})
        return ActionResult(detail=f"weekly summaries sent to {', '.join(to for to, _ in messages) or 'nobody'}",
                            data={"sent": sent})
