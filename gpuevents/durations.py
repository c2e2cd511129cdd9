"""Durations as users write them (`90s`, `15m`, `2h`, `1d`, `1h30m`), parsed to seconds and formatted back."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


class DurationError(ValueError):
    """A duration string that does not parse."""


def parse_duration(text: str | int | float) -> float:
    """Seconds in `text`: `90s`, `15m`, `2h`, `1d`, `1h30m`; a bare number is seconds."""
    if isinstance(text, bool):
        raise DurationError(f"must be a duration like 2h, got {text!r}")
    if isinstance(text, int | float):
        if text < 0:
            raise DurationError(f"must not be negative, got {text!r}")
        return float(text)
    s = text.strip().replace(" ", "")
    if not s:
        raise DurationError("must be a duration like 2h, got an empty string")
    pos = 0
    total = 0.0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if pos != len(s):
        raise DurationError(f"must be a duration like 2h, 15m or 1h30m, got {text!r}")
    return total


def format_duration(seconds: float) -> str:
    """`2h 5m` style, for people: at most two units, no zero parts."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            parts.append(f"{s // size}{unit}")
            s %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def exact_duration(seconds: float) -> str:
    """`1d2h3m4s500ms`: every unit, so `parse_duration` gives back exactly `seconds` (to the ms)."""
    ms_total = round(max(0.0, seconds) * 1000)
    s, ms = divmod(ms_total, 1000)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            parts.append(f"{s // size}{unit}")
            s %= size
    if ms:
        parts.append(f"{ms}ms")
    return "".join(parts) or "0s"


def _validate(value: Any) -> float:
    if isinstance(value, str | int | float):
        return parse_duration(value)
    raise DurationError(f"must be a duration like 2h, got {value!r}")


Duration = Annotated[
    float,
    BeforeValidator(_validate),
    PlainSerializer(exact_duration, return_type=str, when_used="json"),
]
"""A pydantic field type: accepts `2h` or seconds, holds seconds."""
