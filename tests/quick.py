"""The quick test loop (`pytest -m "not slow"`, or GPUEVENTS_QUICK=1): fewer hypothesis examples per property."""

from __future__ import annotations

import os
from typing import Any

QUICK_EXAMPLES = 20  # per property in the quick loop; the full run (.ci/run) keeps each test's own figure

_quick = os.environ.get("GPUEVENTS_QUICK") == "1"


def set_quick(on: bool) -> None:
    global _quick
    _quick = on


def is_quick() -> bool:
    return _quick


def examples(n: int) -> int:
    """`max_examples` for a property that asks for `n`: `n` in a full run, at most QUICK_EXAMPLES in the quick loop."""
    return min(n, QUICK_EXAMPLES) if _quick else n


MARKS_OUT = "GPUEVENTS_MARKS_OUT"


def pytest_collection_finish(session: Any) -> None:
    """Loaded as a plugin (`-p tests.quick`, with GPUEVENTS_MARKS_OUT set): write each collected test's id and
    whether it is marked slow, one collection answering for both sides of `-m slow` / `-m "not slow"`."""
    out = os.environ.get(MARKS_OUT)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            for item in session.items:
                f.write(("slow " if item.get_closest_marker("slow") else "quick ") + item.nodeid + "\n")
