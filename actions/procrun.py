"""Running an argv (never a shell) with a timeout, its output captured and truncated."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcResult:
    returncode: int | None  # None: it was killed on timeout
    output: str
    timed_out: bool = False

    def summary(self) -> str:
        if self.timed_out:
            return "timed out"
        return f"exit {self.returncode}"


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… ({len(text) - limit} more characters cut)"


async def run_argv(argv: Sequence[str], *, timeout: float, output_max: int,
                   env: Mapping[str, str] | None = None, cwd: str | None = None) -> ProcResult:
    """Run `argv` directly (no shell), stdout and stderr together; kill its process group on timeout.

    Raises FileNotFoundError / PermissionError when the program cannot be started.
    """
    full_env = None if env is None else {**os.environ, **env}
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env=full_env, cwd=cwd, start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = await proc.communicate()
        return ProcResult(None, clip(out.decode(errors="replace"), output_max), timed_out=True)
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    return ProcResult(proc.returncode, clip(out.decode(errors="replace"), output_max))
