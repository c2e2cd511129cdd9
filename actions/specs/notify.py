"""The `notify` action's parameters: a post through Apprise to a service that is not Slack, to a channel or an
owner's address there; a recipient from the machine is one person; runtime actions.builtin.notify."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from actions import notify_format as nf
from actions.escaping import UnsafeValue
from actions.protocol import Action, ActionParams
from actions.registry import register

_SERVICE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_ADDRESS = re.compile(r"^@?[A-Za-z0-9._%+'-]+(@[A-Za-z0-9.-]+\.[A-Za-z]{2,})?$")
_EVERYONE = frozenset({"all", "channel", "everyone", "here"})


class NotifyParams(ActionParams):
    type: Literal["notify"] = "notify"
    to: str = Field("", description="an Apprise URL, a service of actions.notify.services, or (with `service`) "
                    "an owner: a user of `owners` or an address")
    service: str | None = Field(None, description="the service of actions.notify.services whose direct "
                                "message reaches `to`")
    text: str | None = None
    template: str | None = Field(default=None, description="a file whose content is the text")
    title: str | None = Field(None, description="unset: the rule and the entity")

    @model_validator(mode="after")
    def _text_and_recipient(self) -> NotifyParams:
        if self.text is None and self.template is None:
            raise ValueError("give `text` or `template`")
        if not self.to.strip() and self.service is None:
            raise ValueError("give `to` (an Apprise URL or a service name), or `service` and `to`")
        return self


def owner_address(text: str) -> str:
    """A recipient from the machine (an owner): one person's name or address, never a URL or a whole channel."""
    bare = text.lstrip("@").lower()
    if not _ADDRESS.match(text) or bare in _EVERYONE:
        raise UnsafeValue(f"{text[:60]!r} from the machine is not one person's name or address")
    return text


def _service_name(text: str) -> str:
    if not _SERVICE_NAME.match(text):
        raise UnsafeValue(f"{text[:60]!r} from the machine is not a service name")
    return text


@register
class NotifySpec(Action[NotifyParams]):
    type: ClassVar[str] = "notify"
    params = NotifyParams
    runtime: ClassVar[str | None] = "actions.builtin.notify:NotifyAction"

    @staticmethod
    def escape(value: str) -> str:
        return nf.mark(value)

    @classmethod
    def readable(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        return dict(nf.unmark(params))

    @classmethod
    def escape_at(cls, path: tuple[str | int, ...]) -> Callable[[str], str]:
        """Text and title: marked, escaped at the run for the service; a recipient must be one person."""
        if path == ("to",):
            return owner_address
        if path == ("service",):
            return _service_name
        return nf.mark
