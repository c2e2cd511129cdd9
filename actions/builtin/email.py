"""The `email` action: a plain-text mail through SMTP (config `actions.email`), as many HPC centres warn by mail.

Values from the machine land in the subject and body as text: the subject loses CR/LF (no header injection), the
recipient must be one address (a name from the machine cannot add recipients). Connection failures and 4xx
replies are retried; 5xx replies (a refused recipient) are not.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from typing import ClassVar, Literal

import aiosmtplib
from pydantic import Field, model_validator

from actions.escaping import UnsafeValue, header_value, no_escape
from actions.protocol import (
    ALL_KINDS,
    ActionContext,
    ActionParams,
    ActionResult,
    ActionUnit,
    PermanentError,
    TransientError,
)
from actions.registry import register

_ADDRESS = re.compile(r"^[A-Za-z0-9._%+'-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}$")
_LOCAL = re.compile(r"^[A-Za-z0-9._%+'-]+$")


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
    if not (_ADDRESS.match(text) or _LOCAL.match(text)):
        raise UnsafeValue(f"{text[:60]!r} from the machine is not one email address or user name")
    return text


@register
class EmailAction:
    type: ClassVar[str] = "email"
    params = EmailParams
    entity_kinds = ALL_KINDS
    destructive: ClassVar[bool] = False
    unit: ClassVar[ActionUnit] = "entity"
    escape = staticmethod(no_escape)

    @staticmethod
    def escape_at(path: tuple[str | int, ...]) -> Callable[[str], str]:
        if path == ("to",):
            return _address_part
        return header_value if path == ("subject",) else no_escape

    async def run(self, ctx: ActionContext) -> ActionResult:
        p = ctx.params
        assert isinstance(p, EmailParams)
        cfg = ctx.config.actions.email
        to = p.to.strip()
        if _LOCAL.match(to) and cfg.default_domain:
            to = f"{to}@{cfg.default_domain}"
        if not _ADDRESS.match(to):
            return ActionResult(status="refused", detail=f"cannot mail {p.to!r}: not an address (set "
                                "actions.email.default_domain to mail user names)")
        body = p.text if p.text is not None else _read(p.template)
        msg = EmailMessage()
        msg["From"] = cfg.sender
        msg["To"] = to
        msg["Subject"] = header_value(p.subject)
        msg["Date"] = formatdate(localtime=False)
        msg["Message-ID"] = make_msgid(idstring=ctx.request.key.replace(":", "."), domain="gpuevents")
        msg["X-Gpuevents-Key"] = ctx.request.key
        msg.set_content(body)
        password = os.environ.get(cfg.password_env) if cfg.username else None
        try:
            errors, response = await aiosmtplib.send(
                msg, hostname=cfg.host, port=cfg.port, start_tls=cfg.starttls, use_tls=cfg.tls,
                username=cfg.username, password=password, timeout=float(ctx.config.actions.timeout) * 0.9)
        except aiosmtplib.SMTPRecipientsRefused as e:
            raise PermanentError(f"SMTP {cfg.host}:{cfg.port} refused {to}: {e}") from None
        except aiosmtplib.SMTPResponseException as e:
            if 400 <= e.code < 500:
                raise TransientError(f"SMTP {cfg.host}:{cfg.port}: {e.code} {e.message}") from None
            raise PermanentError(f"SMTP {cfg.host}:{cfg.port}: {e.code} {e.message}") from None
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as e:
            raise TransientError(f"SMTP {cfg.host}:{cfg.port}: {type(e).__name__}: {e}") from None
        if errors:
            raise PermanentError(f"SMTP {cfg.host}:{cfg.port} refused {', '.join(errors)}")
        return ActionResult(detail=f"mailed {to}", data={"to": to, "response": response})


def _read(path: str | None) -> str:
    assert path is not None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise PermanentError(f"template {path}: {e.strerror}") from None
