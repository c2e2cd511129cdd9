"""The `report` action: posts each team's weekly usage summary to its Slack channel (for a schedule rule).

The summary comes from the rollups store through `Services.report`, which the composition root fills in
(gpuevents/cli/run.py): actions never import the visibility code.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import sys
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from actions import slack_format as fmt
from actions.builtin.slack import SlackAction
from actions.protocol import ALL_KINDS, ActionContext, ActionParams, ActionResult, ActionUnit, PermanentError
from actions.registry import register
from actions.services import services_of, slack_client

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
        summary = svc.report
        now = svc.clock.now()
        targets: list[tuple[str | None, str]] = [(team, to) for team, to in sorted(p.channels.items())]
        if p.to:
            targets.append((None, p.to))
        messages: list[tuple[str, str]] = []
        for team, to in targets:
            try:
                text = await asyncio.to_thread(summary, ctx.config, now, team, p.top_jobs)
            except LookupError as e:
                raise PermanentError(str(e)) from None
            if text is not None:  # None: nothing recorded for that team this week, no message
                messages.append((to, text))
        token = ctx.config.actions.slack.token()
        if token is None:
            for to, text in messages:
                sys.stdout.write(f"[slack → {to}] {text}\n")
            sys.stdout.flush()
            return ActionResult(detail=f"{len(messages)} summaries printed (no SLACK_BOT_TOKEN)")
        client = slack_client(ctx.config, token)
        slack = svc.cache.setdefault("report.slack", SlackAction())
        sent: list[dict[str, Any]] = []
        for to, text in messages:
            blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
            result = await slack.post(client, to, text, blocks, svc.clock.monotonic())
            sent.append({"to": to, **result.data})
        return ActionResult(detail=f"weekly summaries sent to {', '.join(to for to, _ in messages) or 'nobody'}",
                            data={"sent": sent})
