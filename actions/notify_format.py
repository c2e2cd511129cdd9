"""How the `notify` action makes values from the machine safe for each service it posts to through Apprise.

A value is escaped for where it lands, but the service of a `notify` action is known only when it runs (an
owner's address picks it). So rendering only marks what came from the machine (`mark`), and the run escapes the
marked parts for the service its URL names (`finish`): Markdown for Mattermost and Discord, angle brackets for
Google Chat, Slack's entities for Slack, nothing for JSON. In every chat service `@everyone`, `@channel`,
`@here`, `@all`, `<!channel>`, `<@123>` and `<users/all>` from the machine are broken with a zero-width space,
so they cannot ping anyone (Apprise's Discord plugin would otherwise turn a bare `@everyone` into a ping).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

from actions.slack_format import escape as slack_escape

OPEN, CLOSE = "\ue000", "\ue001"  # private-use characters: never in a rule author's text, removed from values
_MARKED = re.compile(f"{OPEN}(.*?){CLOSE}", re.S)
_ZWSP = "\u200b"

Kind = Literal["markdown", "chat", "slack", "text", "email", "data"]

# By the scheme of the Apprise URL: what the receiving service interprets in a message.
_KIND_OF_SCHEME: dict[str, Kind] = {
    "mmost": "markdown", "mmosts": "markdown", "discord": "markdown", "rocket": "markdown",
    "rockets": "markdown", "zulip": "markdown", "matrix": "markdown", "matrixs": "markdown",
    "gchat": "chat", "workflow": "chat", "workflows": "chat", "wxteams": "chat", "webex": "chat",
    "slack": "slack",
    "mailto": "email", "mailtos": "email",
    "json": "data", "jsons": "data", "form": "data", "forms": "data", "xml": "data", "xmls": "data",
    "pagerduty": "text", "opsgenie": "text", "ntfy": "text", "ntfys": "text", "pover": "text",
    "gotify": "text", "gotifys": "text",
}
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~>])")
_PINGS = re.compile(r"([@<])")
_LINK = re.compile(r"(\])(\()")


def mark(text: str) -> str:
    """At rendering: wrap a value from the machine so the run can find it (the markers it holds are dropped)."""
    return f"{OPEN}{text.replace(OPEN, '').replace(CLOSE, '')}{CLOSE}"


def kind_of(url: str) -> Kind:
    """What the service behind this Apprise URL interprets; an unknown chat service is treated as Markdown."""
    scheme = url.split("://", 1)[0].lower()
    return _KIND_OF_SCHEME.get(scheme, "markdown")


def _no_pings(text: str) -> str:
    return _PINGS.sub(lambda m: m.group(1) + _ZWSP, text)


def _markdown(text: str) -> str:
    return _no_pings(_MARKDOWN_SPECIAL.sub(r"\\\1", text))


def _chat(text: str) -> str:
    """Google Chat and Teams cards read no backslash escapes: break links and pings instead."""
    return _LINK.sub(lambda m: m.group(1) + _ZWSP + m.group(2), _no_pings(text))


def _slack(text: str) -> str:
    return _no_pings(slack_escape(text))


ESCAPES: dict[Kind, Callable[[str], str]] = {
    "markdown": _markdown, "chat": _chat, "slack": _slack, "text": _no_pings,
    "email": lambda t: t,  # sent as text: Apprise escapes it for the HTML mail
    "data": lambda t: t,  # sent as JSON: the encoder escapes it
}


def finish(text: str, kind: Kind) -> str:
    """At the run: escape each marked value for the service, and drop the markers."""
    escape = ESCAPES[kind]
    return _MARKED.sub(lambda m: escape(m.group(1)), text).replace(OPEN, "").replace(CLOSE, "")


def unmark(value: Any) -> Any:
    """`value` without the marks (strings, and those inside lists and mappings): as people read it."""
    if isinstance(value, str):
        return value.replace(OPEN, "").replace(CLOSE, "")
    if isinstance(value, list):
        return [unmark(v) for v in value]
    if isinstance(value, dict):
        return {k: unmark(v) for k, v in value.items()}
    return value
