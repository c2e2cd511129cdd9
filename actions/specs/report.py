"""The `report` action's parameters: each team's weekly usage summary to its Slack channel (a schedule rule);
runtime actions.builtin.report."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from actions import slack_format as fmt
from actions.protocol import Action, ActionParams
from actions.registry import register


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
class ReportSpec(Action[ReportParams]):
    type: ClassVar[str] = "report"
    params = ReportParams
    runtime: ClassVar[str | None] = "actions.builtin.report:ReportAction"

    @staticmethod
    def escape(value: str) -> str:
        return fmt.escape(value)
