"""The `gpuevents.io/keep-until` and `gpuevents.io/exclude` annotations, parsed (rules/lang/exemptions.py applies
them in the engine; actions/evidence_kube.py reads them on the object itself before a remedy)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

KEEP_UNTIL = "gpuevents.io/keep-until"
EXCLUDE = "gpuevents.io/exclude"
MAX_AHEAD = timedelta(days=366)


@dataclass(frozen=True, slots=True)
class Exemption:
    until: datetime
    rules: frozenset[str] | None  # None: every rule
    source: str  # the annotation it came from, with its value

    def covers(self, rule: str, now: datetime) -> bool:
        return self.until > now and (self.rules is None or rule in self.rules)


@dataclass(frozen=True, slots=True)
class Malformed:
    annotation: str
    value: str
    why: str

    def __str__(self) -> str:
        return f"{self.annotation}: {self.value!r}: {self.why}"


def _time(text: str) -> datetime:
    t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if t.tzinfo is None:
        raise ValueError("no time zone (write it as RFC 3339, e.g. 2026-12-31T00:00:00Z)")
    return t


def parse(annotations: Mapping[str, str], now: datetime) -> tuple[list[Exemption], list[Malformed]]:
    """The exemptions `annotations` declare, and those that cannot be taken (with why)."""
    out: list[Exemption] = []
    bad: list[Malformed] = []
    for key in (KEEP_UNTIL, EXCLUDE):
        value = annotations.get(key)
        if value is None:
            continue
        until_text, rules = value, None
        if key == EXCLUDE:
            fields: dict[str, str] = {}
            for part in value.split(";"):
                k, sep, v = part.partition("=")
                if not sep and not fields:  # the bare time
                    k, v = "until", part
                fields[k.strip()] = v.strip()
            unknown = set(fields) - {"until", "rules"}
            if unknown:
                bad.append(Malformed(key, value, f"unknown field(s) {', '.join(sorted(unknown))} (until=, rules=)"))
                continue
            if "until" not in fields:
                bad.append(Malformed(key, value, "no end: write until=<RFC 3339 time>; an exclusion must end"))
                continue
            until_text = fields["until"]
            if "rules" in fields:
                rules = frozenset(r.strip() for r in fields["rules"].split(",") if r.strip()) or None
        try:
            until = _time(until_text)
        except ValueError as e:
            bad.append(Malformed(key, value, f"not an RFC 3339 time ({e})"))
            continue
        if until - now > MAX_AHEAD:
            bad.append(Malformed(key, value, f"ends more than {MAX_AHEAD.days} days ahead: not taken"))
            continue
        out.append(Exemption(until=until, rules=rules, source=f"{key}: {value}"))
    return out, bad
