"""The engine's rule files: loaded as `gpuevents rules check` loads them, watched for changes, and reloaded
first in a child process bounded in time and memory, so a hostile file in the folder costs the child only."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import sys
from collections.abc import Sequence
from pathlib import Path

from gpuevents.config import Config
from gpuevents.yamlpos import Located, LocatedError
from rules.intake.check import load_checked
from rules.lang.loader import rule_files
from rules.lang.model import RuleSet

RELOAD_TIMEOUT_S = 20.0
"""A reload whose rule files take longer than this to load and check (in the child) is refused."""
RELOAD_MEMORY = 768 * 1024 * 1024
"""The child's address-space limit: a reload that needs more is refused."""
_CHILD = "rules.engine.rulefiles"


class RuleFiles:
    """The rule files under `paths`; `changed()` says when one was added, removed or modified since the
    last `load()`, whether that load succeeded or not."""

    def __init__(self, paths: Sequence[Path], config: Config) -> None:
        self.paths = list(paths)
        self.config = config
        self.reload_timeout = RELOAD_TIMEOUT_S
        self.reload_memory = RELOAD_MEMORY
        self._mtimes: dict[Path, float] = {}

    def load(self) -> RuleSet:
        """The rule set; LocatedError with every problem otherwise."""
        self._mtimes = self._current()
        return load_checked(self.paths, self.config.engine.timezone, self.config)

    async def reload(self) -> RuleSet:
        """`load()` for a running engine: first in a child process (`reload_timeout`, `reload_memory`), then, when
        the child found the files cheap and sound, in a thread; the event loop never runs the files' cost."""
        self._mtimes = self._current()
        problems = await check_in_child(self.paths, self.config.engine.timezone, timeout=self.reload_timeout,
                                        memory=self.reload_memory)
        if problems:
            raise LocatedError(problems)
        return await asyncio.to_thread(load_checked, self.paths, self.config.engine.timezone, self.config)

    def changed(self) -> bool:
        return self._current() != self._mtimes

    def _current(self) -> dict[Path, float]:
        files, _ = rule_files(self.paths)
        out = {}
        for f in files:
            with contextlib.suppress(OSError):
                out[f] = f.stat().st_mtime
        return out


async def check_in_child(paths: Sequence[Path], timezone: str, *, timeout: float = RELOAD_TIMEOUT_S,
                         memory: int = RELOAD_MEMORY) -> list[Located]:
    """Every problem `rules check` finds in `paths`, found by a child process; a child that runs out of time or
    memory is one problem saying so (the child is killed)."""
    where = str(paths[0]) if paths else "rules"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", _CHILD, str(memory), timezone, *map(str, paths), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return [Located(where, 0, f"the rule files took longer than {timeout:g}s to load; refused (a file "
                                  "that costs this much is not loaded)")]
    except asyncio.CancelledError:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode == 0:
        return []
    if proc.returncode == 1:
        with contextlib.suppress(ValueError, TypeError, KeyError):
            return [Located(p["file"], p["line"], p["message"]) for p in json.loads(out)]
    if proc.returncode == 3 or b"MemoryError" in err:
        return [Located(where, 0, f"the rule files need more than {memory // (1024 * 1024)} MiB to load; "
                                  "refused")]
    tail = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
    return [Located(where, 0, f"the rule files could not be checked: {tail[0][:300]}")]


def _child(argv: list[str]) -> int:
    """`python -m rules.engine.rulefiles MEMORY TIMEZONE PATH...`: exit 0 when the files load and check, 1 with
    the problems as JSON on stdout, 3 when out of memory (the address space is limited to MEMORY bytes)."""
    memory, timezone, *paths = argv
    resource.setrlimit(resource.RLIMIT_AS, (int(memory), int(memory)))
    try:
        load_checked(paths, timezone)
    except LocatedError as e:
        print(json.dumps([{"file": p.file, "line": p.line, "message": p.message} for p in e.problems]))
        return 1
    except MemoryError:
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
