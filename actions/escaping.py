"""Values from the machine, made safe once, for the place each lands.

A template's literal text is the rule author's and is left as written; what a `{{ }}` outputs (a process
name, a pod annotation, a user) passes through the escape of the parameter it lands in. An action says which
with `escape` (one for all its parameters) or `escape_at(path)` (per parameter). Where no escaping can make a
value safe (a channel where a person is expected, a value an argv would read as an option), the escape raises
`UnsafeValue`: the request is refused with the reason, and nothing runs.
"""

from __future__ import annotations

import json
import re
from urllib.parse import quote


class UnsafeValue(ValueError):
    """A value from the machine that no escaping makes safe where it would land."""


def no_escape(text: str) -> str:
    """For values that land as data: a JSON encoder, an argv element, a Kubernetes field."""
    return text


def json_string(text: str) -> str:
    """The inside of a JSON string: `"`, `\\` and control characters escaped (for string bodies, which are JSON
    text). Lone surrogates (undecodable bytes in a process name) become `?`, so the body always encodes."""
    clean = text.encode("utf-8", "replace").decode("utf-8") if not text.isascii() else text
    return json.dumps(clean, ensure_ascii=False)[1:-1]


def url_component(text: str) -> str:
    """A URL path segment or query value: everything but unreserved characters percent-encoded, so `/`, `?`,
    `#`, `&` and `..` cannot steer the request elsewhere."""
    return quote(text, safe="")


_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def header_value(text: str) -> str:
    """An HTTP header value: control characters (CR, LF: a second header) become one space."""
    return _CONTROL.sub(" ", text)


def argv_element(text: str) -> str:
    """Part of an argv element: never a shell, but a value that begins with `-` would be read as an option."""
    if text.startswith("-"):
        raise UnsafeValue(f"the value {text[:40]!r} starts with '-' and would be read as an option; "
                          "pass it as `--opt={{ … }}` or after `--`")
    return text


_PERSON = re.compile(r"^@?[A-Za-z0-9._+'-]+(@[A-Za-z0-9.-]+\.[A-Za-z]{2,})?$")
_EVERYONE = frozenset({"@here", "@channel", "@everyone", "here", "channel", "everyone"})
_CHANNEL_ID = re.compile(r"^[CGD][A-Z0-9]{8,}$")


def slack_person(text: str) -> str:
    """A Slack recipient taken from the machine (an owner, an annotation) must name a person: an email, a user
    id, a handle. `#general`, `<!channel>`, a channel id or anything with spaces is refused."""
    if not _PERSON.match(text) or _CHANNEL_ID.match(text) or text.lower() in _EVERYONE:
        raise UnsafeValue(f"{text[:60]!r} from the machine is not a person (an email, a user id or a handle); "
                          "a recipient from the machine may not be a channel")
    return text


_HOSTLIST = re.compile(r"[\[\],\s]")


def single_node(name: str) -> str:
    """A node name that names one node: Slurm reads `gpu[01-99]` and `a,b` as lists of nodes."""
    if not name or _HOSTLIST.search(name) or name.startswith("-"):
        raise UnsafeValue(f"node name {name[:60]!r} is not one node (Slurm would read a hostlist or an option)")
    return name
