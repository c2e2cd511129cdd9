"""The engine's garbage-collection policy: freeze the long-lived fleet state, collect it fully once an hour.

The fleet state is millions of long-lived objects without cycles; Python's full collections would walk all
of it and find nothing. So the engine collects the young generations and freezes what survives, every
second or whenever the state has grown by FREEZE_STEP, makes full collections rarer, and runs one itself
every FULL_GC_EVERY_S. docs/engine.md ("Garbage collection") has the measurements behind the numbers.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)

GC_THRESHOLDS = (700, 10, 100)  # full collections ten times rarer than Python's default
FREEZE_STEP = 1_000  # entities and incidents of growth that trigger a freeze before the second is up
FREEZE_EVERY_S = 1.0
FULL_GC_EVERY_S = 3600.0
_PYTHON_GC_THRESHOLDS = gc.get_threshold()  # as the process had them before any engine ran


class GcPolicy:
    """`start` when the engine has loaded what lives as long as the process; `tick(size)` after each batch
    and tick (`size`: entities and incidents held); `stop` restores Python's own policy."""

    def __init__(self) -> None:
        self._frozen_size = 0
        self._next_freeze = 0.0
        self._full_gc_at = 0.0

    def start(self) -> None:
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        self._frozen_size = 0
        self._full_gc_at = time.monotonic() + FULL_GC_EVERY_S

    def tick(self, size: int) -> None:
        """Collect the young generations and freeze what is alive, at most every FREEZE_EVERY_S or when the
        state has grown by FREEZE_STEP; a full collection every FULL_GC_EVERY_S."""
        now = time.monotonic()
        self._frozen_size = min(self._frozen_size, size)  # it shrank: count growth from here
        if now < self._next_freeze and size < self._frozen_size + FREEZE_STEP:
            return
        if now >= self._full_gc_at:
            self._full_gc_at = now + FULL_GC_EVERY_S
            gc.unfreeze()
            found = gc.collect()
            log.info("hourly full garbage collection: %.2f s, %d unreachable objects", time.monotonic() - now, found)
        else:
            gc.collect(1)
        gc.freeze()
        self._frozen_size = size
        self._next_freeze = now + FREEZE_EVERY_S

    @staticmethod
    def stop() -> None:
        gc.set_threshold(*_PYTHON_GC_THRESHOLDS)
        gc.unfreeze()  # what this engine froze is collectable again once it is gone
