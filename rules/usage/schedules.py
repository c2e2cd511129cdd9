"""Idle by the clock: from hourly rollups, the nodes and Kubernetes workloads whose GPUs sit idle in the same hours
every day, and the rule that would scale or cordon them in those hours, with its saving and how regular the
pattern was. Pure.

An hour is idle when its GPUs did less than 5 % of their held time busy (or were not held at all, for a node). An
hour of the day belongs to the idle window when it was idle on at least `MIN_REGULARITY` of the days observed; the
window is the longest run of such hours, across midnight if need be, of at least `MIN_HOURS`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from gpuevents.costs import CostModel
from rules.usage.fits import FitAmounts, FitKey
from rules.usage.store import UsageRow

IDLE_SHARE = 0.05
MIN_REGULARITY = 0.85
MIN_HOURS = 4
MIN_DAYS = 5
_WORKLOAD = re.compile(r"^job/kubernetes/([a-z0-9-]+)/(Deployment|StatefulSet)/([a-z0-9.-]+)$")


@dataclass(frozen=True, slots=True)
class Proposal:
    key: str  # `node/<name>` or `job/kubernetes/<ns>/<Kind>/<name>`
    idle: Window  # regularity: of the days it applies to, the share on which every hour of it was idle (0-1)
    gpus: int
    saving_per_week: float
    rule_yaml: str
    cluster: str = ""

    @property
    def window(self) -> str:
        end = (self.idle.start_hour + self.idle.hours) % 24
        text = f"{self.idle.start_hour:02d}:00-{end:02d}:00"
        return text + (" on working days, and weekends" if self.idle.weekends else " every day")


@dataclass(frozen=True, slots=True)
class Window:
    start_hour: int
    hours: int
    regularity: float
    days: int
    weekends: bool  # idle all weekend too: the window holds on working days and the weekend is added

    @property
    def idle_hours_per_week(self) -> int:
        return self.hours * 5 + 48 if self.weekends else self.hours * 7


@dataclass
class _Hours:
    """Per local day and hour: busy and held GPU-seconds; the most GPUs seen and the model."""

    busy: dict[tuple[str, int], float]
    held: dict[tuple[str, int], float]
    gpus: int = 0
    model: str = ""
    node: str = ""  # a node it ran on
    cluster: str = ""
    slurm: bool = False  # a Slurm job ran on the node: it is drained through Slurm, not Kubernetes


def _new() -> _Hours:
    return _Hours(defaultdict(float), defaultdict(float))


def collect(usage: Iterable[UsageRow], fits: Iterable[tuple[FitKey, FitAmounts]],
            tz: ZoneInfo) -> dict[tuple[str, str], _Hours]:
    """Hourly busy/held seconds per node (every GPU, held or not: a node is idle when its GPUs are) and per
    Kubernetes Deployment or StatefulSet (its held GPUs), by local day and hour; keyed by (cluster, key)."""
    out: dict[tuple[str, str], _Hours] = defaultdict(_new)
    node_gpus: dict[tuple[str, str], set[int]] = defaultdict(set)
    for r in usage:
        if r.gpu < 0:
            continue  # a day folded: no hours left to read
        local = datetime.fromtimestamp(r.hour, UTC).astimezone(tz)
        slot = (local.date().isoformat(), local.hour)
        h = out[(r.cluster, f"node/{r.node}")]
        h.busy[slot] += r.busy_s
        h.held[slot] += r.busy_s + r.held_s + r.free_s  # a node's capacity: every GPU-second it had
        h.model = h.model or r.model
        h.node, h.cluster = r.node, r.cluster
        node_gpus[(r.cluster, f"node/{r.node}")].add(r.gpu)
    for key, gpus in node_gpus.items():
        out[key].gpus = len(gpus)
    fits = list(fits)
    for k, a in fits:
        if k.workload.startswith("job/slurm/") and a.node and (k.cluster, f"node/{a.node}") in out:
            out[(k.cluster, f"node/{a.node}")].slurm = True
    for k, a in fits:
        if not _WORKLOAD.match(k.workload) or a.held_s > 3600 * max(a.gpus, 1) + 1:
            continue  # only services can be scaled on a clock; a folded day (over an hour of time) has no hours
        local = datetime.fromtimestamp(k.hour, UTC).astimezone(tz)
        slot = (local.date().isoformat(), local.hour)
        h = out[(k.cluster, k.workload)]
        h.cluster = k.cluster
        h.busy[slot] += sum(a.util_hist[1:])  # seconds at 5 % or more
        h.held[slot] += a.held_s
        h.gpus = max(h.gpus, a.gpus)
        h.model = h.model or a.model
        h.node = h.node or a.node
    return dict(out)


def _idle(hours: _Hours, day: str, hour: int) -> bool:
    return hours.busy.get((day, hour), 0.0) <= IDLE_SHARE * max(hours.held.get((day, hour), 0.0), 1.0)


def idle_window(hours: _Hours) -> Window | None:
    """The longest regular idle window of the days observed; when weekends are idle all day, it is read on the
    working days alone and the weekends are added to it."""
    days = sorted({d for d, _h in hours.held})
    full = [d for d in days if sum(1 for h in range(24) if (d, h) in hours.held) >= 20]
    if len(full) < MIN_DAYS:
        return None
    weekend_days = [d for d in full if datetime.fromisoformat(d).weekday() >= 5]
    weekends = len(weekend_days) >= 2 and sum(
        1 for d in weekend_days if all(_idle(hours, d, h) for h in range(24))) >= MIN_REGULARITY * len(weekend_days)
    basis = [d for d in full if datetime.fromisoformat(d).weekday() < 5] if weekends else full
    if len(basis) < 3:
        return None
    regular = [sum(1 for d in basis if _idle(hours, d, h)) >= MIN_REGULARITY * len(basis) for h in range(24)]
    if all(regular):
        return None  # idle all day: that is an idle workload, for the idle rules, not a schedule
    best: tuple[int, int] | None = None
    for start in range(24):
        if not regular[start] or regular[(start - 1) % 24]:
            continue  # a window starts where the hour before is not idle
        length = 0
        while length < 24 and regular[(start + length) % 24]:
            length += 1
        if best is None or length > best[1]:
            best = (start, length)
    if best is None or best[1] < MIN_HOURS:
        return None
    start, length = best
    window = [(start + i) % 24 for i in range(length)]
    every = sum(1 for d in basis if all(_idle(hours, d, h) for h in window))
    return Window(start, length, every / len(basis), len(full), weekends)


def _rule(key: str, w: Window, timezone: str, anchor: str, cluster: str, slurm: bool) -> str:
    start, length = w.start_hour, w.hours
    end = (start + length) % 24
    days = "Mon-Fri" if w.weekends else "Mon-Sun"
    ranges = (f"{days} {start:02d}:00-24:00, {days} 00:00-{end:02d}:00" if start + length > 24
              else f"{days} {start:02d}:00-{start + length:02d}:00")
    if w.weekends:
        ranges += ", Sat-Sun 00:00-24:00"
    cron = "MON-FRI" if w.weekends else "*"
    schedule = f'["0 {start} * * {cron}", "0 {end} * * {cron}"]'
    slug = re.sub(r"[^a-z0-9-]+", "-", key.lower()).strip("-")[:40].strip("-")
    name = f"idle-hours-{slug}"
    when_idle = f"{start:02d}:00-{end:02d}:00 " + ("on working days and all weekend" if w.weekends else "every day")
    head = (f"rules:\n  - name: {name}\n"
            f"    description: {key} is idle {when_idle} (proposed by gpuevents rightsize)\n")
    m = _WORKLOAD.match(key)
    if m is not None:
        ns, kind, wl = m.groups()
        target = (f"        provider: kubernetes\n        kind: {kind}\n        namespace: {ns}\n"
                  f"        name: {wl}\n")
        # anchored on one node the workload ran on (its pods' nodes keep reporting while it is scaled down; a
        # job entity would be gone with its pods, and its incident would restore the replicas at once)
        return (head + "    entity: node\n"
                f"    when: node.cluster == '{cluster}' and node.name == '{anchor}' and in_window('{ranges}')\n"
                f"    schedule: {schedule}\n    timezone: {timezone}\n"
                f"    labels: {{severity: info}}\n    actions:\n      - type: scale\n{target}        replicas: 0\n"
                f"    on_resolve:\n      - type: scale\n{target}        replicas: previous\n")
    node = key.removeprefix("node/")
    provider = "slurm" if slurm else "kubernetes"  # a node that ran Slurm jobs is drained through Slurm
    return (head + "    entity: node\n"
            f"    when: node.cluster == '{cluster}' and node.name == '{node}' and in_window('{ranges}')\n"
            f"    schedule: {schedule}\n    timezone: {timezone}\n"
            f"    labels: {{severity: info}}\n    actions:\n      - type: cordon\n        provider: {provider}\n"
            f"    on_resolve:\n      - type: uncordon\n        provider: {provider}\n")


def propose(usage: Iterable[UsageRow], fits: Iterable[tuple[FitKey, FitAmounts]], costs: CostModel,
            timezone: str = "UTC") -> list[Proposal]:
    """A proposal per node or workload with a regular idle window, the biggest saving first."""
    tz = ZoneInfo(timezone)
    out = []
    for (cluster, key), hours in collect(usage, fits, tz).items():
        w = idle_window(hours)
        if w is None or not hours.node:
            continue  # no regular window, or no node to anchor the rule on
        saving = costs.hourly(hours.model or None) * max(hours.gpus, 1) * w.idle_hours_per_week * w.regularity
        out.append(Proposal(key, w, hours.gpus, saving, _rule(key, w, timezone, hours.node, cluster, hours.slurm),
                            cluster))
    return sorted(out, key=lambda p: (-p.saving_per_week, p.key, p.cluster))
