"""Running an argv on real child processes: no shell, stdout and stderr together, output cut with what was cut,
the environment added to, a timeout that kills the whole process group, a program that cannot start."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from actions.procrun import ProcResult, clip, run_argv
from tests.waiting import wait_for

PY = sys.executable


async def test_an_argv_runs_without_a_shell_with_both_streams() -> None:
    code = "import sys; print('out $(id)'); print('err', file=sys.stderr); sys.exit(4)"
    result = await run_argv([PY, "-c", code], timeout=30, output_max=1000)
    assert result == ProcResult(4, "out $(id)\nerr\n")
    assert result.summary() == "exit 4"


async def test_output_past_the_limit_is_cut_saying_how_much() -> None:
    result = await run_argv([PY, "-c", "print('x' * 100_000, end='')"], timeout=30, output_max=10)
    assert result.output == "x" * 10 + "\n… (99990 more characters cut)"
    assert result.returncode == 0


async def test_the_environment_is_added_to_and_the_directory_set(tmp_path: Path) -> None:
    code = "import os; print(os.environ['GPUEVENTS_X'], 'PATH' in os.environ, os.getcwd())"
    result = await run_argv([PY, "-c", code], timeout=30, output_max=1000, env={"GPUEVENTS_X": "y"},
                            cwd=str(tmp_path))
    assert result.output == f"y True {tmp_path}\n"


async def test_a_timeout_kills_the_process_group_grandchildren_too(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild"
    code = ("import subprocess, sys, time; "
            f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(600)")
    result = await run_argv([PY, "-c", code], timeout=3, output_max=1000)
    assert result.timed_out and result.returncode is None and result.summary() == "timed out"
    assert result.output == "started\n"
    grandchild = int(pidfile.read_text())
    await wait_for(lambda: not _alive(grandchild), what="the grandchild to be killed with its group")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper is gone for our purpose
        return f.read().split(") ", 1)[1][0] != "Z"


async def test_a_program_that_does_not_exist_raises_for_the_caller_to_report() -> None:
    with pytest.raises(FileNotFoundError):
        await run_argv(["/nonexistent/gpuevents-tool"], timeout=5, output_max=10)


def test_clip_says_how_much_it_cut() -> None:
    assert clip("abc", 3) == "abc"
    assert clip("abcdef", 2) == "ab\n… (4 more characters cut)"
