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
from datetime import datetime
from typing import Any

from gpuevents.exemptions import EXCLUDE, KEEP_UNTIL, MAX_AHEAD, Exemption, Malformed, parse
from rules.lang.views import JobView

__all__ = ["EXCLUDE", "KEEP_UNTIL", "MAX_AHEAD", "Exemption", "Exemptions", "Malformed", "parse"]



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
