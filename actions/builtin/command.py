"""The `command` action's runtime: runs an argv list (never a shell) with a timeout; output goes to the audit."""

from __future__ import annotations

from typing import Literal

from actions.procrun import run_argv
from actions.protocol import ActionContext, ActionResult
from actions.specs.command import CommandParams, CommandSpec


async def run_command(argv: list[str], ctx: ActionContext, *, timeout: float | None = None,
                      env: dict[str, str] | None = None, cwd: str | None = None,
                      ok_codes: tuple[int, ...] | list[int] = (0,)) -> ActionResult:
    """Run `argv` and turn the outcome into an ActionResult (shared by every `provider: command`)."""
    limit = timeout or ctx.config.actions.timeout
    out_max = ctx.config.actions.command_output_max
    try:
        res = await run_argv(argv, timeout=limit * 0.95, output_max=out_max, env=env or None, cwd=cwd)
    except (FileNotFoundError, PermissionError, NotADirectoryError) as e:
        return ActionResult(status="failed", detail=f"cannot run {argv[0]!r}: {e.strerror or e}")
    data = {"argv": argv, "returncode": res.returncode, "output": res.output}
    if res.timed_out:
        return ActionResult(status="failed", detail=f"{argv[0]} timed out after {limit * 0.95:.1f}s; "
                            f"output: {res.output}", data=data)
    status: Literal["ok", "failed"] = "ok" if res.returncode in ok_codes else "failed"
    return ActionResult(status=status, detail=f"{argv[0]}: {res.summary()}; output: {res.output}",
                        data=data)


class CommandAction(CommandSpec):
    async def run(self, params: CommandParams, ctx: ActionContext) -> ActionResult:
        return await run_command(params.argv, ctx, timeout=params.timeout, env=params.env, cwd=params.cwd,
                                 ok_codes=params.ok_codes)
