"""Fleet-wide limits across partitions: each partition's engine writes its rate windows and fleet-share counts
to KV, and counts the others' (refreshed on every tick), so `max_per_hour` and `max_fleet_pct` stay fleet-wide
when engine replicas split the fleet. The others' counts are as fresh as their last tick: a burst in two
partitions within one tick can pass a limit by what each of them decided meanwhile (see docs/engine.md)."""

from __future__ import annotations

import logging
import re

from gpuevents.bus import BusError, Kv
from gpuevents.kvstate import parse_or_none
from rules.core.core import Core
from rules.core.limits import Elsewhere, LimitWindows, ShareCounts
from rules.engine.store import shares_key

log = logging.getLogger(__name__)

SHARES_MAX_AGE_S = 600.0  # a partition that has not reported for this long (gone, or renumbered) is not counted
_PARTITION_KEY = re.compile(r"\.p(\d+)$")


async def exchange(kv: Kv, core: Core, partition: int, now_ts: float) -> None:
    """Write this partition's share counts, then give the core every other partition's windows and shares."""
    totals = {k: len(v) for k, v in core.state.by_kind.items()}
    own = core.limiter.share_counts(totals).model_copy(update={"at": now_ts})
    try:
        await kv.put(shares_key(partition), own.model_dump_json().encode())
        entries = await kv.items("limits.") + await kv.items("shares.")
    except BusError as e:
        log.warning("could not exchange fleet-wide limit counts with the other partitions: %s", e)
        return
    windows: list[LimitWindows] = []
    shares: list[ShareCounts] = []
    for entry in entries:
        m = _PARTITION_KEY.search(entry.key)
        if m is None or int(m.group(1)) == partition:
            continue  # not a partition's record, or this partition's own
        # another partition's records: it writes them over on its next tick
        if entry.key.startswith("limits."):
            w = parse_or_none(LimitWindows, entry, "its partition writes it over")
            if w is not None:
                windows.append(w)
        else:
            counts = parse_or_none(ShareCounts, entry, "its partition writes it over")
            if counts is not None and now_ts - counts.at <= SHARES_MAX_AGE_S:
                shares.append(counts)
    core.limiter.elsewhere = Elsewhere(windows=windows, shares=shares)
