"""Agent clocks the engine does not believe: an event whose time is far from when NATS stored it (a node's
clock minutes fast, a snapshot dated 1970 or 2100) has its agent times moved onto the server's clock.

The reference is the stream's own timestamp, not the engine's receipt time. A time ahead of it by more than
`engine.max_clock_skew` is a clock running fast; a time behind it is what an agent's buffer sends after an
outage, and is believed unless it is more than a day old (a clock that far behind, or a snapshot dated 1970).
Either is counted and logged once per node.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from msgspec.structs import replace

from gpuevents.agentdata import GpuInfo, ProcessInfo
from gpuevents.events import Event, GpuEvent, GpuXidEvent, ProcessEvent, SnapshotEvent

log = logging.getLogger(__name__)

MAX_BEHIND_S = 86_400.0  # older than this behind the server's clock is a broken clock, not a buffered event


def believable(skew_s: float, limit_s: float) -> bool:
    """Whether an event `skew_s` seconds ahead of (or, negative, behind) the server's clock is taken as it is."""
    return -MAX_BEHIND_S <= skew_s <= limit_s


def _shift_gpu(g: GpuInfo, d: timedelta) -> GpuInfo:
    return replace(g, idle_since=g.idle_since - d) if g.idle_since is not None else g


def _shift_process(p: ProcessInfo, d: timedelta) -> ProcessInfo:
    return replace(p, create_time=p.create_time - d)


def shifted(event: Event, d: timedelta) -> Event:
    """`event` with every time its agent read from its own clock moved back by `d`."""
    update: dict[str, object] = {"time": event.time - d}
    if isinstance(event, SnapshotEvent):
        snap = event.data
        update["data"] = replace(snap, gpus=[_shift_gpu(g, d) for g in snap.gpus],
                                 processes=[_shift_process(p, d) for p in snap.processes])
    elif isinstance(event, GpuEvent | GpuXidEvent):
        update["data"] = _shift_gpu(event.data, d)
    elif isinstance(event, ProcessEvent):
        update["data"] = _shift_process(event.data, d)
    return event.model_copy(update=update)


class SkewGuard:
    """`check(event, stored)` gives the event as the engine should believe it, and counts skewed nodes."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.skewed: dict[str, float] = {}  # node -> the last skew seen beyond the limit, in seconds
        self.events = 0  # events whose times were moved

    def check(self, event: Event, stored: datetime | None) -> Event:
        if stored is None:
            return event
        skew = (event.time - stored).total_seconds()
        if believable(skew, self.limit_s):
            if self.skewed.pop(event.source, None) is not None:
                log.info("%s: its clock agrees with the server's again", event.source)
            return event
        self.events += 1
        if event.source not in self.skewed:
            log.warning("%s: its clock is %+.0f s off the NATS server's (over engine.max_clock_skew, %.0f s); "
                        "its times are moved onto the server's clock until it is fixed (run NTP on the node)",
                        event.source, skew, self.limit_s)
        self.skewed[event.source] = skew
        return shifted(event, timedelta(seconds=skew))
