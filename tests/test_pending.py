"""tests/pending.py: a test that leaves an asyncio task pending fails at teardown, naming the task; tasks that
were cancelled, or end by themselves within the settle time, are not counted."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from tests.pending import left_pending

ROOT = Path(__file__).resolve().parent.parent

PROBE = '''
import asyncio

async def test_leaks_a_task():
    asyncio.get_running_loop().create_task(asyncio.sleep(3600), name="leaky-watcher")

async def test_cancels_its_task():
    task = asyncio.create_task(asyncio.sleep(3600))
    task.cancel()

def test_sync_runs_its_own_loop():
    assert asyncio.run(asyncio.sleep(0, result=1)) == 1
'''


async def test_a_task_left_running_is_reported_and_one_ending_is_not() -> None:
    before = asyncio.all_tasks()
    leak = asyncio.create_task(asyncio.sleep(3600), name="leak")
    ending = asyncio.create_task(asyncio.sleep(0.01), name="ending")
    cancelled = asyncio.create_task(asyncio.sleep(3600), name="cancelled")
    cancelled.cancel()
    try:
        assert await left_pending(before) == [leak]
        assert ending.done() and cancelled.cancelled()
    finally:
        leak.cancel()
        await asyncio.gather(leak, return_exceptions=True)


def test_the_autouse_fixture_fails_a_leaking_test_and_names_its_task(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.pending",
                          "-o", "asyncio_mode=auto", "-o", "asyncio_default_fixture_loop_scope=function",
                          "test_probe.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "ERROR at teardown of test_leaks_a_task" in out.stdout
    assert "leaky-watcher" in out.stdout
    assert "3 passed, 1 error" in out.stdout
