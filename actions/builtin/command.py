"""The `command` action: runs an argv list (never a shell) with a timeout; output goes to the audit."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from actions.escaping import no_escape
from actions.procrun import run_argv
from actions.protocol import ALL_KINDS, ActionContext, ActionParams, ActionResult, ActionUnit
from actions.registry import register
from gpuevents.durations import Duration


class CommandParams(ActionParams):
    type: Literal["command"] = "command"
    argv: list[str] = Field(min_length=1, description="program and arguments; each a template")
    timeout: Duration | None = None
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    ok_codes: list[int] = Field(default_factory=lambda: [0])


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


@register
class CommandAction:
    type: ClassVar[str] = "command"
    params = CommandParams
    entity_kinds = ALL_KINDS
    destructive: ClassVar[bool] = True
    unit: ClassVar[ActionUnit] = "entity"
    escape = staticmethod(no_escape)

    async def run(self, ctx: ActionContext) -> ActionResult:
        p = ctx.params
        assert isinstance(p, CommandParams)
        return await run_command(p.argv, ctx, timeout=p.timeout, env=p.env, cwd=p.cwd,
                                 ok_codes=p.ok_codes)
