"""Why an incident resolved, in words for `on_resolve` texts: "kept by alice until 2026-12-03 19:00 UTC"."""

from __future__ import annotations

from datetime import datetime

_WORDS: dict[str, str] = {
    "condition": "cleared: the rule's condition no longer holds",
    "gone": "gone: its node or the entity is no longer there",
    "rule_changed": "closed: its rule changed",
    "rule_removed": "closed: its rule was removed",
}


def resolution_words(reason: str | None, by: str = "", until: datetime | None = None) -> str:
    """`cleared: …`, `kept by alice until 2026-12-03 19:00 UTC`, `snoozed by ops until …`; "" while open."""
    if not reason:
        return ""
    if reason in ("kept", "snoozed"):
        who = f" by {by}" if by else ""
        when = f" until {until.strftime('%Y-%m-%d %H:%M %Z').strip()}" if until is not None else ""
        return f"{reason}{who}{when}"
    return _WORDS.get(reason, reason)
