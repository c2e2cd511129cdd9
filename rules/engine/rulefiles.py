"""The engine's rule files: loaded as `gpuevents rules check` loads them, watched for changes."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

from gpuevents.config import Config
from rules.intake.check import load_checked
from rules.lang.loader import rule_files
from rules.lang.model import RuleSet


class RuleFiles:
    """The rule files under `paths`; `changed()` says when one was added, removed or modified since the
    last `load()`, whether that load succeeded or not."""

    def __init__(self, paths: Sequence[Path], config: Config) -> None:
        self.paths = list(paths)
        self.config = config
        self._mtimes: dict[Path, float] = {}

    def load(self) -> RuleSet:
        """The rule set; LocatedError with every problem otherwise."""
        try:
            return load_checked(self.paths, self.config.engine.timezone, self.config)
        finally:
            self._mtimes = self._current()

    def changed(self) -> bool:
        return self._current() != self._mtimes

    def _current(self) -> dict[Path, float]:
        files, _ = rule_files(self.paths)
        out = {}
        for f in files:
            with contextlib.suppress(OSError):
                out[f] = f.stat().st_mtime
        return out
