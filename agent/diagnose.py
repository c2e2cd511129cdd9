"""The `diagnose` command on `gpuevents.cmd.<cluster>.<node>.diagnose`: run the site's diagnostic (the argv of
`agent.diagnostics`, never a shell, nothing from the command in it) in the background, and report its result in
the node's snapshots (`diag_status`, `diag_passed_at`, `diag_failed_at`, `diag_exit_code`, `diag_output`).

One run at a time: a command while one runs is answered `running`. A run past `timeout` is killed and counts as
failed, as does a program that cannot be started. With `agent.state_dir` the latest result is kept there, so a
restarted agent reports it still (a run the stop interrupted counts as failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gpuevents.aio import guarded_task
from gpuevents.diagnose import AgentDiagnosticsConfig, DiagnoseCommand, DiagnoseReply, DiagResult

if TYPE_CHECKING:
    from gpuevents.bus import Message

log = logging.getLogger(__name__)

READ_CHUNK = 65536


def _now() -> datetime:
    return datetime.now(UTC)


class Diagnostics:
    """Runs one node's diagnostic on command and keeps the latest result."""

    def __init__(self, config: AgentDiagnosticsConfig, clock: Callable[[], datetime] = _now,
                 state: Path | None = None) -> None:
        self.config = config
        self.clock = clock
        self.state = state
        self._task: asyncio.Task[None] | None = None
        self.result: DiagResult | None = self._load()

    @classmethod
    def state_file(cls, directory: Path, node: str) -> Path:
        """`diagnostic-<node>.json` in `agent.state_dir`: the latest result, kept across restarts."""
        return directory / f"diagnostic-{''.join(c if c.isalnum() or c in '-_.' else '_' for c in node)}.json"

    def _load(self) -> DiagResult | None:
        if self.state is None:
            return None
        try:
            r = DiagResult.model_validate_json(self.state.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.error("cannot read the last diagnostic in %s (%s): none is reported until the next run",
                      self.state, e)
            return None
        if r.status == "running":  # the agent stopped during it, and the run with it
            end = self.clock()
            r = r.model_copy(update={"status": "failed", "finished_at": end, "failed_at": end,
                                     "output": "[gpuevents: the agent stopped during the run]"})
        return r

    def _save(self) -> None:
        if self.state is None or self.result is None:
            return
        try:
            self.state.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state.with_suffix(".tmp")
            tmp.write_text(self.result.model_dump_json())
            os.replace(tmp, self.state)
        except OSError as e:
            log.error("cannot keep the diagnostic's result in %s: %s", self.state, e)

    async def answer(self, msg: Message) -> bytes:
        return self.handle(msg.data).model_dump_json().encode()

    def handle(self, data: bytes) -> DiagnoseReply:
        try:
            cmd = DiagnoseCommand.model_validate_json(data)
        except ValidationError as e:
            return DiagnoseReply(outcome="refused", reason=f"malformed diagnose command: {_first_error(e)}")
        argv = self.config.argv
        if not argv:
            reply = DiagnoseReply(outcome="refused", reason="no diagnostic configured on this node "
                                  "(agent.diagnostics.argv)")
        elif self._task is not None and not self._task.done():
            assert self.result is not None
            reply = DiagnoseReply(outcome="running", reason="a run is under way", started_at=self.result.started_at)
        else:
            started = self.clock()
            self.result = DiagResult(status="running", started_at=started, passed_at=self._last("passed_at"),
                                     failed_at=self._last("failed_at"))
            self._save()
            self._task = guarded_task(self._run(list(argv), started), "diagnose")
            reply = DiagnoseReply(outcome="started", started_at=started)
        log.warning("diagnose (rule %r, key %r): %s%s", cmd.rule, cmd.key, reply.outcome,
                    f" ({reply.reason})" if reply.reason else "")
        return reply

    async def wait(self) -> DiagResult | None:
        """The result once the run under way (if any) ends."""
        if self._task is not None:
            await asyncio.shield(self._task)
        return self.result

    async def close(self) -> None:
        """Stop a run under way (its child is killed); the agent is stopping."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def fields(self) -> dict[str, Any]:
        """The node snapshot's fields for the latest result (none before the first run)."""
        r = self.result
        if r is None:
            return {}
        return {"diag_status": r.status, "diag_started_at": r.started_at, "diag_passed_at": r.passed_at,
                "diag_failed_at": r.failed_at, "diag_exit_code": r.exit_code, "diag_output": r.output or None}

    def _last(self, name: str) -> datetime | None:
        return getattr(self.result, name) if self.result is not None else None

    async def _run(self, argv: list[str], started: datetime) -> None:
        code, output, why = await self._exec(argv)
        end = self.clock()
        passed = code == 0 and why is None
        tail = (output + (f"\n[gpuevents: {why}]" if why else ""))
        tail = tail[-self.config.output_tail:] if self.config.output_tail else ""
        self.result = DiagResult(
            status="passed" if passed else "failed", started_at=started, finished_at=end, exit_code=code,
            output=tail, passed_at=end if passed else self._last("passed_at"),
            failed_at=self._last("failed_at") if passed else end,
        )
        self._save()
        log.warning("diagnose %s: %s (exit %s)%s", argv[0], self.result.status, code, f", {why}" if why else "")

    async def _exec(self, argv: list[str]) -> tuple[int | None, str, str | None]:
        """Run argv (no shell, no stdin); its exit code, the tail of its output, and what went wrong if it was
        not a plain exit."""
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            return None, "", f"cannot start {argv[0]}: {e.strerror or e}"
        assert proc.stdout is not None
        keep = max(self.config.output_tail, 1)
        buf = bytearray()

        async def read() -> None:
            assert proc.stdout is not None
            while chunk := await proc.stdout.read(READ_CHUNK):
                buf.extend(chunk)
                del buf[:-keep * 4]  # bounded: only the tail is kept (4 bytes per character at most)

        why: str | None = None
        try:
            await asyncio.wait_for(asyncio.gather(read(), proc.wait()), self.config.timeout)
        except TimeoutError:
            why = f"killed after the timeout of {self.config.timeout:g}s"
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: what it started goes too
                await proc.wait()
        return proc.returncode, buf.decode("utf-8", "replace"), why


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "command"
    return f"{where}: {err['msg']}"
