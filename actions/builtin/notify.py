"""The `notify` action's runtime: a post to a service that is not Slack (Teams, Mattermost, Discord, Google
Chat, PagerDuty, Opsgenie, email, …) through Apprise, to a channel or to an owner's address on that service.

Apprise is synchronous (requests): each post runs in a worker thread with the action's time limit. Apprise only
says whether a post worked, so a failed post is retried (its log lines are the error); a URL Apprise cannot
read, an unknown service or an owner with no address fails at once, unretried. Secrets stay out of rules and the
audit: services are named in config `actions.notify.services`, their URLs read from the environment.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from actions import notify_format as nf
from actions.protocol import ActionContext, ActionResult, PermanentError, TransientError
from actions.specs.notify import NotifyParams, NotifySpec
from gpuevents.config import Config
from gpuevents.config.notify import NotifyService

log = logging.getLogger(__name__)

_DATA_SCHEMES = frozenset({"json", "jsons", "form", "forms", "xml", "xmls"})


def _service(config: Config, name: str) -> NotifyService:
    services = config.actions.notify.services
    if name not in services:
        known = ", ".join(sorted(services)) or "none"
        raise PermanentError(f"no notify service {name!r} in config actions.notify.services (known: {known})")
    return services[name]


def target_url(p: NotifyParams, config: Config) -> tuple[str, str]:
    """(the Apprise URL to post to, what the audit may show of it: never the URL, which holds tokens)."""
    to = p.to.strip()
    if p.service is None:
        if "://" in to:
            return to, f"{to.split('://', 1)[0]}://…"
        svc = _service(config, to)
        url = svc.channel_url()
        if url is None:
            raise PermanentError(f"notify service {to!r} has no channel URL: set ${svc.url_env or '?'} "
                                 f"(actions.notify.services.{to}.url_env)")
        return url, f"{to} (channel)"
    svc = _service(config, p.service)
    if not to:
        url = svc.channel_url()
        if url is None:
            raise PermanentError(f"notify service {p.service!r} has no channel URL: set ${svc.url_env or '?'}")
        return url, f"{p.service} (channel)"
    address = config.owner_address(to, p.service) or (to if svc.owner_as_address else None)
    if address is None:
        raise PermanentError(f"{to!r} has no {p.service} address: give it one in config owners "
                             f"({{user: {{{p.service}: …}}}}) or set actions.notify.services.{p.service}"
                             ".owner_as_address")
    template = svc.person_url()
    if template is None or "{to}" not in template:
        raise PermanentError(f"notify service {p.service!r} cannot reach a person: set its direct_url_env "
                             "to an Apprise URL with {to} where the address goes")
    return template.replace("{to}", quote(address, safe="@+")), f"{p.service} → {address}"


def _with_params(url: str, extra: dict[str, str]) -> str:
    """Add URL arguments Apprise reads (timeouts, a header for JSON services) unless the URL sets them."""
    present = {part.split("=", 1)[0] for part in url.partition("?")[2].split("&") if part}
    add = "&".join(f"{quote(k, safe='+-')}={quote(v, safe='')}" for k, v in extra.items() if k not in present)
    if not add:
        return url
    return f"{url}{'&' if '?' in url else '?'}{add}"


_TOKEN = re.compile(r"[A-Za-z0-9._~\-]{4,}")


def url_secrets(url: str, privacy_url: str | None) -> list[str]:
    """The parts of `url` that may be secret: every piece Apprise's privacy form of it (`privacy_url`) does not
    show; all but the scheme where Apprise cannot read the URL; all but the host for a plain JSON/form/XML
    webhook, whose path often is its token. Longest first, so a secret is cut whole."""
    scheme, _, rest = url.partition("://")
    if scheme.lower() in _DATA_SCHEMES:
        privacy_url = re.split(r"[/?#]", rest.rpartition("@")[2], maxsplit=1)[0]
    shown = set(_TOKEN.findall(privacy_url or "")) | {scheme}
    pieces = set(_TOKEN.findall(url)) | set(_TOKEN.findall(unquote(url)))
    return sorted((t for t in pieces if t not in shown), key=len, reverse=True)


_LOGGERS = ("apprise", "urllib3.connectionpool")  # where a post's URL may be logged (the latter at debug level)


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "…")
    return text


class _Redact(logging.Filter):
    """Cuts one post's URL secrets out of Apprise's log records (of the posting thread) before any handler sees
    them: the engine log, the action's error and the audit never hold a service's key."""

    def __init__(self, thread: int, secrets: list[str]) -> None:
        super().__init__()
        self.thread = thread
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread == self.thread and self.secrets:
            record.msg, record.args = redact(record.getMessage(), self.secrets), ()
        return True


class _ThreadLog(logging.Handler):
    """Apprise's log lines of one post (the thread that sends it): the only account of why a post failed."""

    def __init__(self, thread: int) -> None:
        super().__init__(logging.WARNING)
        self.thread = thread
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread:
            self.lines.append(record.getMessage())


def post(url: str, body: str, title: str, body_format: str, timeout: float,
         notify_type: str = "warning") -> tuple[bool, list[str]]:
    """One post through Apprise, in the calling thread: (worked, Apprise's warnings and errors)."""
    import apprise

    asset = apprise.AppriseAsset(plugin_paths=[], storage_mode="memory")
    thread = threading.get_ident()
    guard = _Redact(thread, url_secrets(url, None))
    for name in _LOGGERS:  # Apprise may log while it reads the URL, before its privacy form is known
        logging.getLogger(name).addFilter(guard)
    try:
        plugin: Any = apprise.Apprise.instantiate(url, asset=asset)
        if plugin is None or isinstance(plugin, bool):
            return False, ["Apprise does not know this URL (see https://appriseit.com/services/)"]
        guard.secrets = url_secrets(url, plugin.url(privacy=True))
        return _notify(plugin, url, body, title, body_format, timeout, notify_type, thread)
    finally:
        for name in _LOGGERS:
            logging.getLogger(name).removeFilter(guard)


def _notify(plugin: Any, url: str, body: str, title: str, body_format: str, timeout: float, notify_type: str,
            thread: int) -> tuple[bool, list[str]]:
    handler = _ThreadLog(thread)
    logger = logging.getLogger("apprise")
    logger.addHandler(handler)
    try:
        query = url.partition("?")[2]
        if "cto=" not in query:  # the URL's own timeouts win; else the action's time limit
            plugin.socket_connect_timeout = timeout
        if "rto=" not in query:
            plugin.socket_read_timeout = timeout
        ok = bool(plugin.notify(body=body, title=title, body_format=body_format, notify_type=notify_type))
    finally:
        logger.removeHandler(handler)
    return ok, handler.lines


def _body_format(kind: nf.Kind) -> str:
    return "markdown" if kind in ("markdown", "chat") else "text"


class NotifyAction(NotifySpec):
    async def run(self, params: NotifyParams, ctx: ActionContext) -> ActionResult:
        p = params
        req = ctx.request
        url, shown = target_url(p, ctx.config)
        kind = nf.kind_of(url)
        raw = p.text if p.text is not None else _read(p.template)
        body = nf.finish(raw, kind)
        title = nf.finish(p.title if p.title is not None else f"{req.rule}: {nf.mark(req.entity_id)}", kind)
        timeout = float(ctx.config.actions.timeout) * 0.9
        scheme = url.split("://", 1)[0].lower()
        # Where the service de-duplicates: a JSON webhook by the request's key; Opsgenie by alias, the incident's
        # id, so a repeat is counted on the alert the firing opened.
        extra = {"+Idempotency-Key": req.key} if scheme in _DATA_SCHEMES else (
            {"alias": req.incident_id} if scheme == "opsgenie" else {})
        # A firing warns, a resolution is good news (the colour in chats; a new alert in Opsgenie).
        notify_type = "success" if req.phase == "resolve" else "warning"
        if scheme == "opsgenie" and req.phase == "resolve":
            return ActionResult(status="refused", detail=(
                f"notify {shown}: Apprise closes only Opsgenie alerts it opened in the same process, so it would "
                f"send nothing; close the alert by its alias {req.incident_id} (a `webhook` to Opsgenie's "
                "close API does it)"))
        ok, lines = await asyncio.to_thread(post, _with_params(url, extra), body, title, _body_format(kind),
                                            timeout, notify_type)
        if not ok:
            why = "; ".join(lines[-3:]) or "Apprise reported a failure"
            if lines and lines[0].startswith("Apprise does not know"):
                raise PermanentError(f"notify {shown}: {why}")
            raise TransientError(f"notify {shown}: {why}")
        return ActionResult(detail=f"posted to {shown}", data={"service": p.service or p.to.split("://")[0],
                                                               "kind": kind, "to": shown})


def _read(path: str | None) -> str:
    assert path is not None
    try:
        return Path(path).read_text()
    except OSError as e:
        raise PermanentError(f"template {path}: {e.strerror}") from None
