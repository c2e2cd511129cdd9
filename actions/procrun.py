"""Running an argv (never a shell) with a timeout, its output captured and truncated."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuevents.aio import guarded_task


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
    """`text` cut to `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… ({len(text) - limit} more characters cut)"


async def _drain(stream: asyncio.StreamReader, keep: int) -> tuple[bytes, int]:
    """Read to EOF; keep the first `keep` bytes and count the rest."""
    kept = bytearray()
    total = 0
    while chunk := await stream.read(65536):
        total += len(chunk)
        if len(kept) < keep:
            kept += chunk[: keep - len(kept)]
    return bytes(kept), total


def _text(kept: bytes, total: int) -> str:
    text = kept.decode(errors="replace")
    return text if total <= len(kept) else text + f"\n… ({total - len(kept)} more characters cut)"


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
    assert proc.stdout is not None
    reader = guarded_task(_drain(proc.stdout, output_max), f"reading the output of {argv[0]}", awaited=True)
    timed_out = False
    try:
        await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        timed_out = True
        _kill_group(proc.pid)
        await proc.wait()
    except asyncio.CancelledError:
        _kill_group(proc.pid)
        reader.cancel()
        raise
    try:
        # A grandchild that escaped the group could hold the pipe open; do not wait on it for long.
        kept, total = await asyncio.wait_for(asyncio.shield(reader), 2.0)
    except TimeoutError:
        reader.cancel()
        kept, total = b"", 0
    return ProcResult(None if timed_out else proc.returncode, _text(kept, total), timed_out)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
