"""The `webhook` action's parameters: an HTTP request with a JSON body; runtime actions.builtin.webhook."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import Field

from actions.escaping import header_value, json_string, no_escape, url_component
from actions.protocol import Action, ActionParams
from actions.registry import register
from gpuevents.durations import Duration


class WebhookParams(ActionParams):
    type: Literal["webhook"] = "webhook"
    url: str = Field(pattern=r"^https?://")
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict)
    body: Any = Field(default=None, description="JSON (a mapping, a list, or a string holding JSON); "
                      "unset: the incident")
    timeout: Duration | None = None


@register
class WebhookSpec(Action[WebhookParams]):
    type: ClassVar[str] = "webhook"
    params = WebhookParams
    runtime: ClassVar[str | None] = "actions.builtin.webhook:WebhookAction"

    @classmethod
    def escape_at(cls, path: tuple[str | int, ...]) -> Callable[[str], str]:
        """Once, for where the value lands: the URL percent-encoded, a string body (JSON text) JSON-escaped, a
        mapping body left to the JSON encoder, headers without CR/LF."""
        top = path[0] if path else None
        if top == "url":
            return url_component
        if top == "body":
            return json_string if len(path) == 1 else no_escape
        if top == "headers":
            return header_value
        return no_escape
