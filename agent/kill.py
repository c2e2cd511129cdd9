"""The kill command on `gpuevents.cmd.<cluster>.<node>.kill`: verify, refuse what is protected, signal, escalate."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from pydantic import ValidationError

from agent.sample import AccessDenied, LiveProcess, ProcessControl
from gpuevents.commands import CREATE_TIME_TOLERANCE_S, KILL_WAIT_S, KillCommand, KillOutcome, KillReply, Signal
from gpuevents.config import ProtectConfig

if TYPE_CHECKING:  # the kill handler itself loads no bus
    from gpuevents.bus import Message

log = logging.getLogger(__name__)

#: the refusal when the OS will not let the agent read or signal the process
ACCESS_DENIED = "access denied (the agent needs CAP_KILL / root)"


class KillPolicy:
    """What may never be killed on this node: pid 1, the agent itself, protected users, names, namespaces, nodes."""

    def __init__(self, protect: ProtectConfig, *, agent_pid: int, node_labels: Mapping[str, str],
                 host_pids: bool = True) -> None:
        self.protect = protect
        self.agent_pid = agent_pid
        self.host_pids = host_pids
        self.set_node_labels(node_labels)

    def set_node_labels(self, node_labels: Mapping[str, str]) -> None:
        """The node's labels changed (the Kubernetes node was read again)."""
        self.node_protected = bool(self.protect.node_labels) and any(
            node_labels.get(k) == v for k, v in self.protect.node_labels.items()
        )

    def refusal(self, pid: int, live: LiveProcess | None, pod: str | None = None) -> str | None:
        """The reason this process must not be killed, or None."""
        if pid == 1:
            return "pid 1 is never killed"
        if pid == self.agent_pid:
            return "that is the gpuevents agent itself"
        if self.node_protected:
            return "this node is protected (protect.node_labels)"
        if not self.host_pids:
            return ("the agent is not in the host's pid namespace (run it with hostPID / --pid=host): "
                    "the pid may name another process")
        if live is None:
            return None
        if live.user is not None and live.user in self.protect.users:
            return f"user {live.user!r} is protected (protect.users)"
        if live.user is None and self.protect.users:
            return (f"the user of pid {pid} cannot be named (no entry in the host's user database): "
                    "cannot tell whether it is protected")
        if pod is not None and pod.split("/", 1)[0] in self.protect.namespaces:
            return f"namespace {pod.split('/', 1)[0]!r} is protected (protect.namespaces)"
        return self.protect.program_reason(pid, live.exe, live.user)  # /proc/<pid>/exe, never its comm


class RateLimit:
    """At most `per_minute` kills in any rolling minute; 0 disables kills on this node."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self._times: collections.deque[float] = collections.deque()

    def take(self) -> bool:
        now = self.clock()
        while self._times and now - self._times[0] >= 60.0:
            self._times.popleft()
        if len(self._times) >= self.per_minute:
            return False
        self._times.append(now)
        return True


class KillHandler:
    """Answers kill commands for one node."""

    def __init__(
        self,
        *,
        control: ProcessControl,
        policy: KillPolicy,
        rate: RateLimit,
        holds_gpu: Callable[[LiveProcess], bool],
        pod_of: Callable[[int], str | None] = lambda pid: None,
        poll_s: float = 0.05,
    ) -> None:
        self.control = control
        self.policy = policy
        self.rate = rate
        self.holds_gpu = holds_gpu
        self.pod_of = pod_of
        self.poll_s = poll_s

    async def answer(self, msg: Message) -> bytes:
        """The bus handler: a KillCommand in, a KillReply out (a malformed command is refused)."""
        try:
            cmd = KillCommand.model_validate_json(msg.data)
        except ValidationError as e:
            bad = KillReply(outcome="refused", pid=0, reason=f"malformed kill command: {e}")
            return bad.model_dump_json().encode()
        reply = await self.handle(cmd)
        return reply.model_dump_json().encode()

    async def handle(self, cmd: KillCommand) -> KillReply:
        reply = await self._handle(cmd)
        log.warning("kill pid %d (%s, rule %s, key %s): %s%s", cmd.pid, cmd.signal, cmd.rule or "-",
                    cmd.key or "-", reply.outcome, f" ({reply.reason})" if reply.reason else "")
        return reply

    async def _handle(self, cmd: KillCommand) -> KillReply:
        pid = cmd.pid
        early = self.policy.refusal(pid, None)
        if early is not None:
            return KillReply(outcome="refused", pid=pid, reason=early)
        try:
            live = self.control.lookup(pid)
        except AccessDenied:
            return KillReply(outcome="refused", pid=pid, reason=ACCESS_DENIED)
        if live is None:
            return KillReply(outcome="gone", pid=pid, reason="no such process")
        def reply(outcome: KillOutcome, reason: str = "", signal: Signal | None = None) -> KillReply:
            return KillReply(outcome=outcome, pid=pid, reason=reason, signal=signal,
                             user=live.user, name=live.name)

        if abs((live.create_time - cmd.create_time).total_seconds()) > CREATE_TIME_TOLERANCE_S:
            return reply("refused", f"create time differs: pid {pid} started at {live.create_time.isoformat()}, "
                                    f"not {cmd.create_time.isoformat()} (the pid was reused)")
        refusal = self.policy.refusal(pid, live, self.pod_of(pid))
        if refusal is not None:
            return reply("refused", refusal)
        if cmd.require_gpu and not self.holds_gpu(live):
            return reply("refused", "it holds no GPU (per the latest sample)")
        if not self.rate.take():
            return reply("refused", "kills are disabled on this node (agent.kill.max_per_minute: 0)"
                         if self.rate.per_minute == 0 else
                         f"rate limit: at most {self.rate.per_minute} kills per minute on this node")
        try:
            return await self._signal(cmd, live, reply)
        except AccessDenied:
            return reply("refused", ACCESS_DENIED)

    async def _signal(self, cmd: KillCommand, live: LiveProcess,
                      reply: Callable[..., KillReply]) -> KillReply:
        pid = cmd.pid
        if not self.control.send(pid, live.create_time, cmd.signal):
            return reply("gone", "it ended before it was signalled")
        if cmd.signal == "KILL":
            await self._wait_end(live, KILL_WAIT_S)
            return reply("killed", signal="KILL")
        if await self._wait_end(live, cmd.grace_s):
            return reply("exited", signal=cmd.signal)
        if not self.control.send(pid, live.create_time, "KILL"):
            return reply("exited", f"it ended just after the {cmd.grace_s:g}s grace", cmd.signal)
        if await self._wait_end(live, KILL_WAIT_S):
            return reply("killed", f"still running {cmd.grace_s:g}s after {cmd.signal}", "KILL")
        return reply("killed", f"SIGKILL sent but the process was still there after {KILL_WAIT_S:g}s "
                               "(uninterruptible sleep?)", "KILL")

    async def _wait_end(self, live: LiveProcess, timeout: float) -> bool:
        """Poll until the process is gone; False if it outlives `timeout`."""
        deadline = time.monotonic() + timeout
        while self.control.alive(live.pid, live.create_time):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(self.poll_s, left))
        return True
