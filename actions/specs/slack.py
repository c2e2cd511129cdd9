"""The `slack` action's parameters: a Block Kit DM or channel post, optionally a digest per owner, with buttons;
runtime actions.builtin.slack."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from actions import slack_format as fmt
from actions.escaping import slack_person
from actions.protocol import Action, ActionParams
from actions.registry import register
from gpuevents.durations import Duration


class SlackButtons(BaseModel):
    """Buttons on the message (DESIGN §5.1): keep it for a while, end it now, or say it is not yours."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    keep: list[Duration] = Field(default_factory=list, description="one button per duration, e.g. [4h, 8h, 24h]")
    release: bool = False
    not_mine: bool = False

    def any(self) -> bool:
        return bool(self.keep) or self.release or self.not_mine


class SlackParams(ActionParams):
    type: Literal["slack"] = "slack"
    to: str = Field(min_length=1, description="an email, a user id (U…), @handle, #channel or a channel id")
    text: str | None = None
    template: str | None = Field(default=None, description="a file whose (rendered) content is the text")
    digest: bool = Field(default=False, description="one DM per recipient per window, listing every incident")
    digest_window: Duration | None = Field(default=None,
                                           description="default: config actions.slack.digest_window, else 15m")
    snooze_hint: bool | None = None
    buttons: SlackButtons | None = None

    @model_validator(mode="after")
    def _text_or_template(self) -> SlackParams:
        if self.text is None and self.template is None:
            raise ValueError("give `text` or `template`")
        if not self.to.strip():
            raise ValueError("`to` rendered empty: does the entity have an owner?")
        return self


@register
class SlackSpec(Action[SlackParams]):
    type: ClassVar[str] = "slack"
    params = SlackParams
    runtime: ClassVar[str | None] = "actions.builtin.slack:SlackAction"

    @staticmethod
    def escape(value: str) -> str:
        return fmt.escape(value)

    @classmethod
    def escape_at(cls, path: tuple[str | int, ...]) -> Callable[[str], str]:
        """Text is Slack mrkdwn, escaped; a recipient from the machine must be a person, never a channel."""
        return slack_person if path == ("to",) else fmt.escape
