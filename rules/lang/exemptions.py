"""Exemptions where developers live: `gpuevents.io/keep-until` and `gpuevents.io/exclude` annotations on a pod, its
top owner or its namespace (the agent carries them on the job), applied like snoozes to the job and to the GPUs
and processes that are its; every exemption has an end, and a malformed one is reported, never taken as forever.

- `gpuevents.io/keep-until: 2026-12-24T18:00:00Z` — a keep: exempt from every rule until then.
- `gpuevents.io/exclude: until=2026-12-31T00:00:00Z` (or the bare time), optionally `;rules=idle-gpu-2h,job-idle-1h`
  — exempt from those rules (all when none are listed) until then.

An end further ahead than `MAX_AHEAD` is malformed too: an exemption nobody can forget is not one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rules.lang.views import JobView

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


class Exemptions:
    """The exemptions of the jobs now known, by the job's id as GPUs and processes name it (`gpu.job`)."""

    def __init__(self) -> None:
        self.active: dict[str, list[Exemption]] = {}
        self.malformed: dict[str, list[Malformed]] = {}
        self.reported: set[tuple[str, str, str]] = set()

    def update(self, job: str, annotations: Mapping[str, str], now: datetime) -> list[Malformed]:
        """Take the job's annotations; the malformed ones not reported before (to log once)."""
        found, bad = parse(annotations, now) if annotations else ([], [])
        live = [e for e in found if e.until > now]
        if live:
            self.active[job] = live
        else:
            self.active.pop(job, None)
        if bad:
            self.malformed[job] = bad
        else:
            self.malformed.pop(job, None)
        new = [m for m in bad if (job, m.annotation, m.value) not in self.reported]
        self.reported.update((job, m.annotation, m.value) for m in new)
        return new

    def remove(self, job: str) -> None:
        self.active.pop(job, None)
        self.malformed.pop(job, None)

    def for_view(self, view: Any, rule: str, now: datetime) -> Exemption | None:
        """The exemption covering this entity (a job, or a GPU or process of one) for `rule`, or None."""
        job = view.id if isinstance(view, JobView) else getattr(view, "job", None)
        if job is None:
            return None
        for e in self.active.get(job, ()):
            if e.covers(rule, now):
                return e
        return None

    def until(self, job: str, now: datetime) -> Exemption | None:
        """The exemption of the job from every rule that lasts longest (for status and messages)."""
        live = [e for e in self.active.get(job, ()) if e.until > now]
        return max(live, key=lambda e: (e.rules is None, e.until), default=None)

    def next_end(self) -> datetime | None:
        """The earliest end of an exemption in force (its entities are evaluated again then)."""
        return min((e.until for found in self.active.values() for e in found), default=None)

    def expired(self, now: datetime) -> list[str]:
        """The jobs an exemption of which ended by `now` (dropped: their entities are to be evaluated again)."""
        done: list[str] = []
        for job, found in list(self.active.items()):
            live = [e for e in found if e.until > now]
            if len(live) != len(found):
                done.append(job)
                if live:
                    self.active[job] = live
                else:
                    del self.active[job]
        return done
