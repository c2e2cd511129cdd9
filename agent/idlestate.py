"""The node's idle clocks kept on disk, so an agent restart does not reset them.

Without it, a restarted agent reports every idle GPU as idle since the restart: an idle rule resolves and starts
its two hours again (and an upgrade rollout would do that fleet-wide). With `agent.state_dir`, the agent writes
`idle-<node>.json` (GPU uuid → idle_since) after each snapshot and, at start, carries those clocks over for GPUs
that are still idle on their first sample — only when the file is recent (`max_age`), since the agent cannot know
what a GPU did while no one watched.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timedelta
from pathlib import Path

log = logging.getLogger(__name__)


class IdleStateFile:
    def __init__(self, directory: Path, node: str) -> None:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in node)
        self.path = directory / f"idle-{safe}.json"
        self._warned = False

    def load(self, now: datetime, max_age: timedelta) -> dict[str, datetime]:
        """The saved idle clocks, if saved within `max_age` of `now`; {} otherwise (or when unreadable)."""
        try:
            raw = json.loads(self.path.read_text())
            saved_at = datetime.fromisoformat(raw["saved_at"])
            marks = {str(k): datetime.fromisoformat(v) for k, v in raw["idle_since"].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            log.warning("ignoring the saved idle clocks in %s: %s", self.path, e)
            return {}
        if not timedelta(0) <= now - saved_at <= max_age:
            log.info("the saved idle clocks in %s are from %s: too old to carry over", self.path, saved_at)
            return {}
        return {k: v for k, v in marks.items() if v <= now}

    def save(self, now: datetime, marks: dict[str, datetime]) -> None:
        """Write the clocks and when they were saved, atomically (after each snapshot)."""
        data = {k: v.isoformat() for k, v in marks.items()}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"saved_at": now.isoformat(), "idle_since": data}))
            os.replace(tmp, self.path)
        except OSError as e:
            if not self._warned:
                self._warned = True
                log.warning("cannot keep the idle clocks in %s (%s): an agent restart resets them", self.path, e)
