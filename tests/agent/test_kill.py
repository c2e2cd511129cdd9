"""The kill command on real child processes: verification, refusals, TERM then KILL after the grace."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psutil
import pytest

from agent.attribution import PsutilIdentifier
from agent.kill import RateLimit
from agent.nvml import NvmlSampler
from agent.runner import NodeAgent
from gpuevents.bus import Message
from gpuevents.commands import KillCommand, KillReply
from gpuevents.config import AgentConfig, AgentKillConfig, Config, ProtectConfig
from tests.agent.fake_pynvml import FakeDevice, FakeNvml

IGNORES_TERM = ("import signal, sys, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print('ready', flush=True)\n"
                "time.sleep(60)\n")
SLEEPS = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"


def spawn(code: str = SLEEPS) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(5)


def agent_for(pids: list[int], config: Config | None = None) -> NodeAgent:
    """An agent whose (stand-in) NVML reports `pids` on GPU 0, after one sample."""
    config = config or Config(protect=ProtectConfig(users=[]))
    nv = FakeNvml([FakeDevice(compute=[(pid, 1000) for pid in pids])])
    agent = NodeAgent(config, NvmlSampler(nv, identifier=PsutilIdentifier()), node="n1")
    agent.tick(datetime.now(UTC))
    return agent


def created(pid: int) -> datetime:
    return datetime.fromtimestamp(psutil.Process(pid).create_time(), UTC)


async def kill(agent: NodeAgent, pid: int, **kw: object) -> KillReply:
    ct = kw.pop("create_time") if "create_time" in kw else created(pid)
    cmd = KillCommand(pid=pid, create_time=ct, **kw)
    raw = await agent.kill.answer(Message(cmd.model_dump_json().encode(), "gpuevents.cmd.default.n1.kill"))
    return KillReply.model_validate_json(raw)


async def test_the_right_process_dies(children: list[subprocess.Popen[str]]) -> None:
    target, bystander = spawn(), spawn()
    children += [target, bystander]
    agent = agent_for([target.pid, bystander.pid])
    reply = await kill(agent, target.pid, grace_s=5)
    assert (reply.outcome, reply.signal, reply.user) == ("exited", "TERM", getpass.getuser())
    assert target.wait(5) == -15
    assert bystander.poll() is None


async def test_a_pid_with_another_create_time_is_refused(children: list[subprocess.Popen[str]]) -> None:
    p = spawn()
    children.append(p)
    agent = agent_for([p.pid])
    reply = await kill(agent, p.pid, create_time=created(p.pid) - timedelta(seconds=30))
    assert reply.outcome == "refused" and "create time differs" in reply.reason
    assert p.poll() is None


async def test_a_protected_user_is_refused(children: list[subprocess.Popen[str]]) -> None:
    p = spawn()
    children.append(p)
    agent = agent_for([p.pid], Config(protect=ProtectConfig(users=[getpass.getuser()])))
    reply = await kill(agent, p.pid)
    assert reply.outcome == "refused" and "protected" in reply.reason and getpass.getuser() in reply.reason
    assert p.poll() is None


async def test_a_protected_process_name_is_refused(children: list[subprocess.Popen[str]]) -> None:
    p = spawn()
    children.append(p)
    agent = agent_for([p.pid], Config(protect=ProtectConfig(users=[], process_patterns=["python*"])))
    reply = await kill(agent, p.pid)
    assert reply.outcome == "refused" and "python*" in reply.reason
    assert p.poll() is None


RENAMES_ITSELF = ("import ctypes, time\n"
                  "ctypes.CDLL(None).prctl(15, b'nvidia-smi', 0, 0, 0)  # PR_SET_NAME\n"
                  "print('ready', flush=True)\n"
                  "time.sleep(60)\n")


async def test_a_process_that_renames_itself_after_a_protected_program_is_not_protected(
        children: list[subprocess.Popen[str]]) -> None:
    p = spawn(RENAMES_ITSELF)
    children.append(p)
    assert psutil.Process(p.pid).name() == "nvidia-smi"  # what /proc/<pid>/comm now says
    agent = agent_for([p.pid], Config(protect=ProtectConfig(users=[], process_patterns=["nvidia-smi", "nvidia-*"])))
    reply = await kill(agent, p.pid, grace_s=5)
    assert reply.outcome == "exited", reply.reason
    assert p.wait(5) == -15


async def test_a_program_is_protected_by_its_path_and_the_user_that_runs_it(
        children: list[subprocess.Popen[str]]) -> None:
    p = spawn(RENAMES_ITSELF)
    children.append(p)
    exe = psutil.Process(p.pid).exe()
    mine = ProtectConfig(users=[], processes=[{"exe": exe, "user": getpass.getuser()}])
    reply = await kill(agent_for([p.pid], Config(protect=mine)), p.pid)
    assert reply.outcome == "refused" and reply.reason == f"program {exe} run by {getpass.getuser()} is protected"
    assert p.poll() is None
    others = ProtectConfig(users=[], processes=[{"exe": exe, "user": "someone-else"}])
    reply = await kill(agent_for([p.pid], Config(protect=others)), p.pid, grace_s=5)
    assert reply.outcome == "exited", reply.reason  # the same program run by another user is not protected
    assert p.wait(5) == -15


async def test_a_child_ignoring_term_gets_kill_after_the_grace(children: list[subprocess.Popen[str]]) -> None:
    p = spawn(IGNORES_TERM)
    children.append(p)
    agent = agent_for([p.pid])
    reply = await kill(agent, p.pid, grace_s=0.5)
    assert (reply.outcome, reply.signal) == ("killed", "KILL")
    assert p.wait(5) == -9


async def test_signal_kill_at_once(children: list[subprocess.Popen[str]]) -> None:
    p = spawn(IGNORES_TERM)
    children.append(p)
    reply = await kill(agent_for([p.pid]), p.pid, signal="KILL")
    assert (reply.outcome, reply.signal) == ("killed", "KILL")
    assert p.wait(5) == -9


async def test_a_process_holding_no_gpu_is_refused(children: list[subprocess.Popen[str]]) -> None:
    p = spawn()
    children.append(p)
    agent = agent_for([])
    reply = await kill(agent, p.pid)
    assert reply.outcome == "refused" and "no GPU" in reply.reason
    assert p.poll() is None


async def test_gone_when_the_process_has_ended(children: list[subprocess.Popen[str]]) -> None:
    p = spawn()
    agent = agent_for([p.pid])
    ct = created(p.pid)
    p.kill()
    p.wait(5)
    reply = await kill(agent, p.pid, create_time=ct)
    assert reply.outcome == "gone"


async def test_pid_1_and_the_agent_itself_are_refused() -> None:
    agent = agent_for([])
    now = datetime.now(UTC)
    one = await kill(agent, 1, create_time=now)
    me = await kill(agent, os.getpid(), create_time=now)
    assert one.outcome == "refused" and "pid 1" in one.reason
    assert me.outcome == "refused" and "agent itself" in me.reason


async def test_node_rate_limit_refuses_past_the_limit(children: list[subprocess.Popen[str]]) -> None:
    procs = [spawn(), spawn()]
    children.extend(procs)
    config = Config(protect=ProtectConfig(users=[]), agent=AgentConfig(kill=AgentKillConfig(max_per_minute=1)))
    agent = agent_for([p.pid for p in procs], config)
    first = await kill(agent, procs[0].pid, grace_s=5)
    second = await kill(agent, procs[1].pid, grace_s=5)
    assert first.outcome == "exited"
    assert second.outcome == "refused" and "rate limit" in second.reason
    assert procs[1].poll() is None


async def test_malformed_command_is_refused() -> None:
    raw = await agent_for([]).kill.answer(Message(b'{"pid": "x"}', "s"))
    assert KillReply.model_validate_json(raw).outcome == "refused"


def test_rate_limit_window_rolls() -> None:
    t = [0.0]
    rl = RateLimit(2, clock=lambda: t[0])
    assert rl.take() and rl.take() and not rl.take()
    t[0] = 60.0
    assert rl.take()
    assert not RateLimit(0).take()


async def test_a_process_the_agent_may_not_read_is_refused_not_gone(
        children: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    target = spawn()
    children.append(target)
    agent = agent_for([target.pid])
    ct = created(target.pid)

    def denied(self: psutil.Process) -> str:
        raise psutil.AccessDenied(self.pid)

    monkeypatch.setattr(psutil.Process, "name", denied)  # what an agent without root sees
    reply = await kill(agent, target.pid, create_time=ct, grace_s=1)
    assert (reply.outcome, reply.reason) == ("refused", "access denied (the agent needs CAP_KILL / root)")
    assert target.poll() is None


async def test_a_process_the_agent_may_not_signal_is_refused(
        children: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    target = spawn()
    children.append(target)
    agent = agent_for([target.pid])

    def denied(self: psutil.Process, sig: int) -> None:
        raise psutil.AccessDenied(self.pid)

    monkeypatch.setattr(psutil.Process, "send_signal", denied)
    reply = await kill(agent, target.pid, grace_s=1)
    assert (reply.outcome, reply.reason) == ("refused", "access denied (the agent needs CAP_KILL / root)")
    assert target.poll() is None
