"""Kill end to end: the kill action, the runner, a real nats-server, the agent's kill handler, real processes."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import psutil
import pytest

from actions.builtin import kill as kill_action
from actions.runner import ActionRunner
from agent import kill as agent_kill
from agent.attribution import PsutilControl
from agent.kill import KillHandler, KillPolicy, RateLimit
from agent.runner import KILL_CONCURRENCY
from agent.sample import LiveProcess
from gpuevents import subjects as S
from gpuevents.bus import Bus
from gpuevents.config import ProtectConfig
from tests.actions.conftest import make_config, make_request
from tests.waiting import wait_for

IGNORES_TERM = ("import signal, sys, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print('ready', flush=True)\n"
                "time.sleep(60)\n")


class Children:
    """Real child processes for the test, reaped at the end whatever happened."""

    def __init__(self) -> None:
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self, *argv: str, wait_ready: bool = False) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
        self.procs.append(proc)
        if wait_ready:
            assert proc.stdout is not None
            assert (await asyncio.wait_for(proc.stdout.readline(), 10)).strip() == b"ready"
        return proc

    async def close(self) -> None:
        for p in self.procs:
            if p.returncode is None:
                p.kill()
            await p.wait()


def fact(proc: asyncio.subprocess.Process, name: str = "train") -> dict[str, object]:
    created = datetime.fromtimestamp(psutil.Process(proc.pid).create_time(), UTC)
    return {"pid": proc.pid, "create_time": created.isoformat(), "user": "alice", "name": name}


@pytest.fixture
async def children() -> AsyncIterator[Children]:
    c = Children()
    try:
        yield c
    finally:
        await c.close()


class Unkillable(PsutilControl):
    """Real processes, except that SIGKILL to `stuck` pids is lost, as for a process in uninterruptible
    sleep; every command the handler sees is counted."""

    def __init__(self) -> None:
        super().__init__()
        self.stuck: set[int] = set()
        self.signals: list[tuple[int, str]] = []

    def send(self, pid: int, create_time: datetime, signal_name: str) -> bool:
        self.signals.append((pid, signal_name))
        if signal_name == "KILL" and pid in self.stuck:
            return self.alive(pid, create_time)
        return super().send(pid, create_time, signal_name)


@pytest.fixture
def control() -> Unkillable:
    return Unkillable()


@pytest.fixture
async def on_gpu(bus: Bus, control: Unkillable) -> AsyncIterator[set[int]]:
    """The agent of node n1, with the real kill handler served as the agent serves it (each command in
    its own task); pids in the returned set 'hold a GPU'."""
    holding: set[int] = set()
    handler = KillHandler(
        control=control,
        policy=KillPolicy(ProtectConfig(users=[], process_patterns=["sleep"]), agent_pid=os.getpid(),
                          node_labels={}),
        rate=RateLimit(100),
        holds_gpu=lambda p: isinstance(p, LiveProcess) and p.pid in holding,
        poll_s=0.02,
    )
    sub = await bus.serve(S.command_subject("default", "n1", "kill"), handler.answer,
                          concurrency=KILL_CONCURRENCY, what="kill command")
    yield holding
    await sub.unsubscribe()


async def gone(proc: asyncio.subprocess.Process) -> bool:
    return proc.returncode is not None or not psutil.pid_exists(proc.pid) or \
        psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE


async def test_a_gpu_rule_kills_every_process_on_the_gpu_escalating_to_sigkill(
        bus: Bus, on_gpu: set[int], children: Children) -> None:
    polite = await children.start(sys.executable, "-c", "import time; time.sleep(60)")
    stubborn = await children.start(sys.executable, "-c", IGNORES_TERM, wait_ready=True)
    on_gpu.update({polite.pid, stubborn.pid})
    runner = await ActionRunner.open(bus, make_config())
    record = await runner.process(make_request(
        "kill", {"grace": 0.5}, facts={"processes": [fact(polite), fact(stubborn)]}))
    assert record.outcome == "ok", record
    assert record.detail == (f"pid {polite.pid} exited; pid {stubborn.pid} killed "
                             "(still running 0.5s after TERM)")
    await wait_for(lambda: gone(polite), what="the polite child to end")
    await wait_for(lambda: gone(stubborn), what="the stubborn child to end")
    assert await asyncio.wait_for(stubborn.wait(), 5) == -9


async def test_the_agent_refuses_and_the_audit_says_why(bus: Bus, on_gpu: set[int], children: Children) -> None:
    no_gpu = await children.start(sys.executable, "-c", "import time; time.sleep(60)")
    protected = await children.start("sleep", "60")
    on_gpu.add(protected.pid)
    runner = await ActionRunner.open(bus, make_config())
    not_on_gpu = await runner.process(make_request("kill", {"grace": 0.5}, entity_kind="process",
                                                   facts={"process": fact(no_gpu)}))
    # Named innocently in the request, so only the agent's own check (name pattern 'sleep') stops it.
    by_name = await runner.process(make_request("kill", {"grace": 0.5}, entity_kind="process",
                                                facts={"process": fact(protected)}))
    reused = {**fact(no_gpu), "create_time": "2020-01-01T00:00:00+00:00"}
    stale = await runner.process(make_request("kill", {}, entity_kind="process", facts={"process": reused}))
    init = await runner.process(make_request("kill", {}, entity_kind="process", facts={"process": {
        "pid": 1, "create_time": "2020-01-01T00:00:00+00:00", "user": "alice", "name": "init"}}))
    assert [r.outcome for r in (not_on_gpu, by_name, stale, init)] == ["refused"] * 4
    assert not_on_gpu.error == f"pid {no_gpu.pid} refused (it holds no GPU (per the latest sample))"
    assert by_name.error == (f"pid {protected.pid} refused (program {psutil.Process(protected.pid).exe()} "
                             "matches protected pattern 'sleep')")
    assert "the pid was reused" in (stale.error or "")
    assert init.error == "pid 1 refused (pid 1 is never killed)"
    assert no_gpu.returncode is None and protected.returncode is None
    assert psutil.Process(no_gpu.pid).is_running() and psutil.Process(protected.pid).is_running()


async def test_a_process_that_already_ended_is_gone(bus: Bus, on_gpu: set[int], children: Children) -> None:
    short = await children.start(sys.executable, "-c", "pass")
    f = fact(short)
    await short.wait()
    record = await (await ActionRunner.open(bus, make_config())).process(
        make_request("kill", {}, entity_kind="process", facts={"process": f}))
    assert record.outcome == "ok" and record.detail == f"pid {short.pid} gone (no such process)"


async def test_two_stuck_processes_on_a_gpu_are_handled_at_once_and_each_signalled_once(
        bus: Bus, on_gpu: set[int], children: Children, control: Unkillable,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Shrunk to keep the test short; the proportions are the real ones: the agent may spend
    # grace + KILL_WAIT_S on each command, more than grace + the margin.
    monkeypatch.setattr(agent_kill, "KILL_WAIT_S", 1.0)
    monkeypatch.setattr(kill_action, "KILL_WAIT_S", 1.0)
    monkeypatch.setattr(kill_action, "REPLY_MARGIN_S", 0.8)
    first = await children.start(sys.executable, "-c", IGNORES_TERM, wait_ready=True)
    second = await children.start(sys.executable, "-c", IGNORES_TERM, wait_ready=True)
    on_gpu.update({first.pid, second.pid})
    control.stuck.update({first.pid, second.pid})
    runner = await ActionRunner.open(bus, make_config())
    record = await runner.process(make_request(
        "kill", {"grace": 0.5}, facts={"processes": [fact(first), fact(second)]}))
    stuck = "SIGKILL sent but the process was still there after 1s (uninterruptible sleep?)"
    assert (record.outcome, record.attempt) == ("ok", 1), record
    assert record.detail == f"pid {first.pid} killed ({stuck}); pid {second.pid} killed ({stuck})"
    # One TERM and one KILL each: no command was sent twice.
    assert sorted(control.signals) == sorted([(first.pid, "TERM"), (first.pid, "KILL"),
                                              (second.pid, "TERM"), (second.pid, "KILL")])
