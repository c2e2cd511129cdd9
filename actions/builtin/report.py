"""The `report` action's runtime: posts each team's weekly usage summary to its Slack channel (for a schedule rule).

The summary comes from the rollups store through `ctx.services.report`, which the composition root fills in
(gpuevents/cli/run.py): actions never import the visibility code.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from actions.builtin.slack import SlackAction
from actions.protocol import ActionContext, ActionResult, PermanentError
from actions.services import slack_client
from actions.specs.report import ReportParams, ReportSpec

log = logging.getLogger(__name__)


class ReportAction(ReportSpec):
    async def run(self, params: ReportParams, ctx: ActionContext) -> ActionResult:
        p = params
        svc = ctx.services
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
