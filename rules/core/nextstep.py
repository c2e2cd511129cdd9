"""What an incident's next staged action will do, in words: "in 1 minute this will be logged, unless you keep it"."""

from __future__ import annotations

from collections.abc import Sequence

# What each action type does to the incident's entity, as a past participle after "this will be".
_DONE: dict[str, str] = {
    "log": "logged",
    "kill": "ended (its processes are killed)",
    "power_cap": "power-capped (its power limit lowered while idle)",
    "diagnose": "diagnosed (the site's GPU diagnostic run)",
    "cancel": "cancelled",
    "pause": "paused",
    "resume": "resumed",
    "drain": "drained",
    "cordon": "cordoned",
    "uncordon": "uncordoned",
    "scale": "scaled",
    "slack": "followed by a Slack message",
    "notify": "followed by a notification",
    "email": "followed by an email",
    "webhook": "reported to a webhook",
    "command": "handed to a command",
    "publish": "published to other rules",
    "function": "handed to a function",
    "report": "reported",
}
_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def duration_words(seconds: float) -> str:
    """`1 minute`, `2 hours 5 minutes`, `30 seconds`: at most two units, spelt out."""
    s = int(max(0.0, seconds) + 0.5)
    parts: list[str] = []
    for name, size in _UNITS:
        if s >= size:
            n, s = divmod(s, size)
            parts.append(f"{n} {name}{'' if n == 1 else 's'}")
        if len(parts) == 2:
            break
    return " ".join(parts) or "0 seconds"


def done_words(types: Sequence[str]) -> str:
    """`logged`, `cordoned and drained`: what the actions of a stage do, in words (a plugin type by its name)."""
    words = list(dict.fromkeys(_DONE.get(t, f"handed to the `{t}` action") for t in types))
    if len(words) <= 1:
        return words[0] if words else "acted on"
    return ", ".join(words[:-1]) + " and " + words[-1]


def next_step_words(types: Sequence[str], seconds: float) -> str:
    """The sentence for `incident.next.says`; "now" when it is due."""
    when = "now" if seconds < 1 else f"in {duration_words(seconds)}"
    return f"{when} this will be {done_words(types)}, unless you keep it"
