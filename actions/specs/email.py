"""The `email` action's parameters: a plain-text mail through SMTP; the recipient is one address, the subject
one line; runtime actions.builtin.email."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from actions.escaping import UnsafeValue, header_value, no_escape
from actions.protocol import Action, ActionParams
from actions.registry import register

ADDRESS = re.compile(r"^[A-Za-z0-9._%+'-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}$")
LOCAL = re.compile(r"^[A-Za-z0-9._%+'-]+$")


class EmailParams(ActionParams):
    type: Literal["email"] = "email"
    to: str = Field(min_length=1, description="an address, or a user name with actions.email.default_domain")
    subject: str = Field(min_length=1)
    text: str | None = None
    template: str | None = Field(default=None, description="a file whose (rendered) content is the text")

    @model_validator(mode="after")
    def _text_or_template(self) -> EmailParams:
        if self.text is None and self.template is None:
            raise ValueError("give `text` or `template`")
        return self


def _address_part(text: str) -> str:
    """A recipient from the machine: one address or one user name, nothing that adds a recipient or a header."""
    if not (ADDRESS.match(text) or LOCAL.match(text)):
        raise UnsafeValue(f"{text[:60]!r} from the machine is not one email address or user name")
    return text


@register
class EmailSpec(Action[EmailParams]):
    type: ClassVar[str] = "email"
    params = EmailParams
    runtime: ClassVar[str | None] = "actions.builtin.email:EmailAction"

    @classmethod
    def escape_at(cls, path: tuple[str | int, ...]) -> Callable[[str], str]:
        if path == ("to",):
            return _address_part
        return header_value if path == ("subject",) else no_escape
