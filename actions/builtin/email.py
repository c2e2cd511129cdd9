"""The `email` action's runtime: a plain-text mail through SMTP (config `actions.email`), as HPC centres warn.

Values from the machine land in the subject and body as text: the subject loses CR/LF (no header injection), the
recipient must be one address (a name from the machine cannot add recipients). Connection failures and 4xx
replies are retried; 5xx replies (a refused recipient) are not.
"""

from __future__ import annotations

import os
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

import aiosmtplib

from actions.escaping import header_value
from actions.protocol import ActionContext, ActionResult, PermanentError, TransientError
from actions.specs.email import ADDRESS, LOCAL, EmailParams, EmailSpec


class EmailAction(EmailSpec):
    async def run(self, params: EmailParams, ctx: ActionContext) -> ActionResult:
        p = params
        cfg = ctx.config.actions.email
        to = p.to.strip()
        if LOCAL.match(to) and cfg.default_domain:
            to = f"{to}@{cfg.default_domain}"
        if not ADDRESS.match(to):
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
